"""Triton kernels of the fused MoE MLP: two grouped GEMMs over expert-sorted slots.

A program takes one tile of BLOCK_M rows of `ExpertBlocks` (slots of one expert, padded)
and BLOCK_N output columns, and walks the reduction dimension in steps of BLOCK_K with a
float32 accumulator. `_gate_up_kernel` multiplies the slots' tokens by the expert's gate
and up rows of w13 at once and stores silu(gate) * up in hidden's dtype (the dtype the op
computes it in); `_down_kernel` multiplies that by w2 and by the slot's routing weight
and stores float32, for the launcher to add each token's K slots before rounding. Both
store at the slot's own row, so rows of slots no expert serves are never written.

This module imports triton at the top: import it only where triton is available. Under
`TRITON_INTERPRET=1` (set before this module is imported) the kernels run on CPU
tensors, which is how the tests check them; the interpreter cannot multiply bfloat16
tiles, so there the bfloat16 tiles are converted to float32 before each `tl.dot`. The
kernels call only `triton.language` builtins, no `@triton.jit` library helpers such as
`tl.zeros`, `tl.cdiv` or `tl.sigmoid`: those are decorated when triton is imported, so a
process that imported triton before setting TRITON_INTERPRET could not interpret them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from core_moe_triton.ops import ExpertBlocks

__all__ = ["down_weighted", "gate_up_silu"]

_INTERPRETED = triton.knobs.runtime.interpret  # as `@triton.jit` saw it below
_MIN_TILE = 16  # tl.dot's smallest tile side
_MAX_BLOCK_N = 64
_MAX_BLOCK_K = 64


@triton.jit
def _gate_up_kernel(
    out_ptr,  # [T * K, I]: silu(gate) * up at each routed slot's row
    hidden_ptr,  # [T, H]
    w13_ptr,  # [E, 2 * I, H]: gate rows, then up rows
    sorted_slot_ids_ptr,  # int32 [num_blocks * BLOCK_M]
    block_expert_ids_ptr,  # int32 [num_blocks]
    num_experts,
    num_slots,
    top_k,
    inter,
    size,
    stride_ht,
    stride_hh,
    stride_we,
    stride_wn,
    stride_wk,
    stride_os,
    stride_on,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """Program (tile, column block): BLOCK_N columns of silu(gate) * up for a tile's slots."""
    tile = tl.program_id(0)
    expert = tl.load(block_expert_ids_ptr + tile)
    if expert >= num_experts:  # past the last expert's tiles
        return
    slots = tl.load(sorted_slot_ids_ptr + tile * BLOCK_M + tl.arange(0, BLOCK_M))
    row_in = slots < num_slots  # the padding slot holds no token
    tokens = (slots // top_k).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_in = cols < inter
    ks = tl.arange(0, BLOCK_K)
    x_ptrs = hidden_ptr + tokens[:, None] * stride_ht + ks[None, :] * stride_hh  # [M, K]
    gate_ptrs = (
        w13_ptr
        + expert.to(tl.int64) * stride_we
        + cols[None, :] * stride_wn
        + ks[:, None] * stride_wk
    )  # [BLOCK_K, BLOCK_N]: the gate rows, transposed
    up_ptrs = gate_ptrs + inter * stride_wn
    gate = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
    up = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
    for start in range(0, size, BLOCK_K):
        k_in = ks < size - start
        x = tl.load(x_ptrs, mask=row_in[:, None] & k_in[None, :], other=0.0)
        w_mask = k_in[:, None] & col_in[None, :]
        w_gate = tl.load(gate_ptrs, mask=w_mask, other=0.0)
        w_up = tl.load(up_ptrs, mask=w_mask, other=0.0)
        if UPCAST:
            x = x.to(tl.float32)
            w_gate = w_gate.to(tl.float32)
            w_up = w_up.to(tl.float32)
        gate += tl.dot(x, w_gate, input_precision="ieee")
        up += tl.dot(x, w_up, input_precision="ieee")
        x_ptrs += BLOCK_K * stride_hh
        gate_ptrs += BLOCK_K * stride_wk
        up_ptrs += BLOCK_K * stride_wk
    act = gate / (1.0 + tl.exp(-gate)) * up  # silu(gate) * up
    out_ptrs = out_ptr + slots.to(tl.int64)[:, None] * stride_os + cols[None, :] * stride_on
    tl.store(out_ptrs, act.to(out_ptr.dtype.element_ty), mask=row_in[:, None] & col_in[None, :])


@triton.jit
def _down_kernel(
    out_ptr,  # float32 [T * K, H]: each routed slot's weighted expert output
    act_ptr,  # [T * K, I]
    w2_ptr,  # [E, H, I]
    topk_weights_ptr,  # [T, K]
    sorted_slot_ids_ptr,  # int32 [num_blocks * BLOCK_M]
    block_expert_ids_ptr,  # int32 [num_blocks]
    num_experts,
    num_slots,
    top_k,
    size,
    inter,
    stride_as,
    stride_ai,
    stride_we,
    stride_wn,
    stride_wk,
    stride_rt,
    stride_rk,
    stride_os,
    stride_on,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """Program (tile, column block): BLOCK_N columns of weight * (w2 @ act) for a tile's
    slots."""
    tile = tl.program_id(0)
    expert = tl.load(block_expert_ids_ptr + tile)
    if expert >= num_experts:
        return
    slots = tl.load(sorted_slot_ids_ptr + tile * BLOCK_M + tl.arange(0, BLOCK_M))
    row_in = slots < num_slots
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_in = cols < size
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = act_ptr + slots.to(tl.int64)[:, None] * stride_as + ks[None, :] * stride_ai
    w_ptrs = (
        w2_ptr
        + expert.to(tl.int64) * stride_we
        + cols[None, :] * stride_wn
        + ks[:, None] * stride_wk
    )  # [BLOCK_K, BLOCK_N]: w2[expert] transposed
    acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
    for start in range(0, inter, BLOCK_K):
        k_in = ks < inter - start
        a = tl.load(a_ptrs, mask=row_in[:, None] & k_in[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=k_in[:, None] & col_in[None, :], other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            w = w.to(tl.float32)
        acc += tl.dot(a, w, input_precision="ieee")
        a_ptrs += BLOCK_K * stride_ai
        w_ptrs += BLOCK_K * stride_wk
    tokens = slots // top_k
    weight_ptrs = (
        topk_weights_ptr + tokens.to(tl.int64) * stride_rt + (slots - tokens * top_k) * stride_rk
    )
    weights = tl.load(weight_ptrs, mask=row_in, other=0.0)
    # The op weighs in hidden's dtype (the reference casts the weights to it first).
    weights = weights.to(act_ptr.dtype.element_ty).to(tl.float32)
    out_ptrs = out_ptr + slots.to(tl.int64)[:, None] * stride_os + cols[None, :] * stride_on
    tl.store(out_ptrs, acc * weights[:, None], mask=row_in[:, None] & col_in[None, :])


def gate_up_silu(
    out: torch.Tensor,  # [T * K, I], hidden's dtype
    hidden: torch.Tensor,  # [T, H]
    w13: torch.Tensor,  # [E, 2 * I, H], hidden's dtype
    blocks: ExpertBlocks,
) -> None:
    """Write silu(gate) * up of w13[e] @ hidden[t] at the row of each routed slot (t, e)."""
    num_experts, size = w13.shape[0], w13.shape[2]
    inter = out.shape[1]
    block_n, block_k = _block(inter, _MAX_BLOCK_N), _block(size, _MAX_BLOCK_K)
    _gate_up_kernel[(blocks.num_blocks, triton.cdiv(inter, block_n))](
        out,
        hidden,
        w13,
        blocks.sorted_slot_ids,
        blocks.block_expert_ids,
        num_experts,
        blocks.num_slots,
        blocks.top_k,
        inter,
        size,
        *hidden.stride(),
        *w13.stride(),
        *out.stride(),
        BLOCK_M=blocks.block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        UPCAST=_upcast(hidden.dtype),
    )


def down_weighted(
    out: torch.Tensor,  # float32 [T * K, H], zero where no expert writes
    act: torch.Tensor,  # [T * K, I], from gate_up_silu
    w2: torch.Tensor,  # [E, H, I], act's dtype
    topk_weights: torch.Tensor,  # [T, K], any float dtype
    blocks: ExpertBlocks,
) -> None:
    """Write topk_weights[t, j] * w2[e] @ act[s] at the row of each routed slot s = (t, j)."""
    num_experts, size, inter = w2.shape
    block_n, block_k = _block(size, _MAX_BLOCK_N), _block(inter, _MAX_BLOCK_K)
    _down_kernel[(blocks.num_blocks, triton.cdiv(size, block_n))](
        out,
        act,
        w2,
        topk_weights,
        blocks.sorted_slot_ids,
        blocks.block_expert_ids,
        num_experts,
        blocks.num_slots,
        blocks.top_k,
        size,
        inter,
        *act.stride(),
        *w2.stride(),
        *topk_weights.stride(),
        *out.stride(),
        BLOCK_M=blocks.block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        UPCAST=_upcast(act.dtype),
    )


def _block(extent: int, largest: int) -> int:
    """A tile side for a dimension of `extent`: its next power of two, within [16, largest]."""
    return min(largest, max(_MIN_TILE, triton.next_power_of_2(extent)))


def _upcast(dtype: torch.dtype) -> bool:
    """Whether tiles go to float32 before tl.dot: bfloat16 under the interpreter only."""
    return _INTERPRETED and dtype == torch.bfloat16
