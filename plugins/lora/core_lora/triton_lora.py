"""Triton kernels of multi-LoRA compute: each token row runs through its own adapter's slot.

A LoRA layer adds x @ A^T @ B to the base output, with A and B taken from the slot of the
token's adapter. `lora_shrink` computes s = x @ A[slot]^T into float32 and `lora_expand`
adds s @ B[slot] to y in place; tokens with slot -1 run on the base model alone.

Both are one grouped matmul, y[t] += x[t] @ w[slot_t] (shrink adds to a zero-filled s), done
the punica (vLLM sgmv) way: the tokens are sorted by slot once per call, and the program
(m, n, slot) multiplies the m-th BLOCK_M rows of that slot's group by the slot's weight tile
with `tl.dot`. A group shorter than BLOCK_M, or than 16 (tl.dot's smallest tile), is masked;
programs past the end of their group return at once. Tokens whose slot is outside [0, L),
-1 among them, belong to no group: no program reads or writes their rows.

The operands are cast to float32 inside the kernel and multiplied with IEEE precision (no
TF32): products of fp16 or bf16 values are exact in fp32, so s carries only fp32 summation
error whatever the activation dtype, and y is rounded to its dtype once, after the add.
LoRA's few FLOPs (rank << hidden size) make the lost tensor-core speed a small cost.

This module imports triton at the top: import it only where triton is available. Under
`TRITON_INTERPRET=1` (set before this module is imported) the kernel runs on CPU tensors,
which is how the tests check it. The kernel calls only `triton.language` builtins, no
`@triton.jit` library helpers such as `tl.zeros` or `tl.cdiv`: those are decorated when
triton is imported, so a process that imported triton before setting TRITON_INTERPRET could
not interpret them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["lora_apply", "lora_expand", "lora_shrink"]

_ACTIVATION_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_MIN_BLOCK = 16  # tl.dot's smallest tile side
_MAX_BLOCK = 64


@triton.jit
def _add_slot_matmul_kernel(
    x_ptr,  # [T, K]
    w_ptr,  # [L, K, N], read through its strides
    y_ptr,  # [T, N], updated in place
    sorted_token_ids_ptr,  # int64 [T]: token ids ordered by slot
    slot_starts_ptr,  # int64 [L]: where each slot's group begins in sorted_token_ids
    slot_counts_ptr,  # int64 [L]: how many tokens each slot's group holds
    N,
    K,
    stride_xt,
    stride_xk,
    stride_wl,
    stride_wk,
    stride_wn,
    stride_yt,
    stride_yn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    num_n_blocks = (N + BLOCK_N - 1) // BLOCK_N
    pid_m = tl.program_id(0) // num_n_blocks
    pid_n = tl.program_id(0) % num_n_blocks
    slot = tl.program_id(1).to(tl.int64)
    count = tl.load(slot_counts_ptr + slot)
    if pid_m * BLOCK_M >= count:
        return

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < count
    tokens = tl.load(
        sorted_token_ids_ptr + tl.load(slot_starts_ptr + slot) + rows, mask=row_mask, other=0
    )  # [BLOCK_M]
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    w_slot_ptr = w_ptr + slot * stride_wl

    acc = tl.full((BLOCK_M, BLOCK_N), 0.0, dtype=tl.float32)
    for k_start in range(0, K, BLOCK_K):
        offs_k = k_start + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        x = tl.load(
            x_ptr + tokens[:, None] * stride_xt + offs_k[None, :] * stride_xk,
            mask=row_mask[:, None] & k_mask[None, :],
            other=0.0,
        )  # [BLOCK_M, BLOCK_K]
        w = tl.load(
            w_slot_ptr + offs_k[:, None] * stride_wk + offs_n[None, :] * stride_wn,
            mask=k_mask[:, None] & n_mask[None, :],
            other=0.0,
        )  # [BLOCK_K, BLOCK_N]
        acc += tl.dot(x.to(tl.float32), w.to(tl.float32), input_precision="ieee")

    y_ptrs = y_ptr + tokens[:, None] * stride_yt + offs_n[None, :] * stride_yn
    y_mask = row_mask[:, None] & n_mask[None, :]
    y = tl.load(y_ptrs, mask=y_mask, other=0.0)
    tl.store(y_ptrs, (y.to(tl.float32) + acc).to(y_ptr.dtype.element_ty), mask=y_mask)


def lora_shrink(
    x: torch.Tensor,  # [T, in] float16 / bfloat16 / float32
    lora_a: torch.Tensor,  # [L, W, in], x's dtype
    token_slots: torch.Tensor,  # int64 [T], slot in [0, L) or -1
) -> torch.Tensor:  # float32 [T, W]
    """s[t] = lora_a[token_slots[t]] @ x[t] in float32; 0 for tokens whose slot is -1.

    All tensors must be on one device that triton can launch on (CUDA, or CPU under
    TRITON_INTERPRET=1). Slots are not range-checked (that would synchronize the device):
    any slot outside [0, L) counts as -1.
    """
    _check_shrink(x, lora_a, token_slots)
    s = torch.zeros(x.shape[0], lora_a.shape[1], dtype=torch.float32, device=x.device)
    _add_slot_matmul(x, lora_a.transpose(1, 2), s, token_slots)  # w: [L, in, W]
    return s


def lora_expand(
    s: torch.Tensor,  # float32 [T, W]
    lora_b: torch.Tensor,  # [L, W, out], y's dtype
    token_slots: torch.Tensor,  # int64 [T], slot in [0, L) or -1
    y: torch.Tensor,  # [T, out] float16 / bfloat16 / float32, updated in place
) -> None:
    """y[t] += s[t] @ lora_b[token_slots[t]], accumulated in float32 and rounded to y's
    dtype once; rows of tokens whose slot is -1 are left untouched (not even rewritten).

    Device and slot range as `lora_shrink`.
    """
    _check_expand(s, lora_b, token_slots, y)
    _add_slot_matmul(s, lora_b, y, token_slots)


def lora_apply(
    x: torch.Tensor,  # [T, in]
    lora_a: torch.Tensor,  # [L, W, in]
    lora_b: torch.Tensor,  # [L, W, out]
    token_slots: torch.Tensor,  # int64 [T]
    y: torch.Tensor,  # [T, out], updated in place
) -> None:
    """y[t] += lora_b[slot]^T @ (lora_a[slot] @ x[t]) for each token with a slot: the
    LoRA delta of `lora_shrink` then `lora_expand`, whose contracts it keeps."""
    if lora_a.dim() == 3 and lora_b.dim() == 3 and lora_b.shape[:2] != lora_a.shape[:2]:
        raise ValueError(
            f"lora_b has (L, W) = {tuple(lora_b.shape[:2])}, lora_a has "
            f"{tuple(lora_a.shape[:2])}: both hold the same slots of the same width"
        )
    lora_expand(lora_shrink(x, lora_a, token_slots), lora_b, token_slots, y)


def _add_slot_matmul(
    x: torch.Tensor,  # [T, K]
    w: torch.Tensor,  # [L, K, N]
    y: torch.Tensor,  # [T, N]
    token_slots: torch.Tensor,  # int64 [T]
) -> None:
    """y[t] += x[t] @ w[token_slots[t]] for the tokens whose slot is in [0, L)."""
    num_tokens, k_size = x.shape
    num_slots, n_size = w.shape[0], w.shape[2]
    if num_tokens == 0:
        return  # a launch grid must not be empty
    sorted_token_ids, slot_starts, slot_counts = _group_tokens(token_slots, num_slots)
    block_m = _block(num_tokens)
    block_n = _block(n_size)
    grid = (triton.cdiv(num_tokens, block_m) * triton.cdiv(n_size, block_n), num_slots)
    _add_slot_matmul_kernel[grid](
        x,
        w,
        y,
        sorted_token_ids,
        slot_starts,
        slot_counts,
        n_size,
        k_size,
        *x.stride(),
        *w.stride(),
        *y.stride(),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=_block(k_size),
    )


def _group_tokens(
    token_slots: torch.Tensor, num_slots: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sorted_token_ids [T], slot_starts [L], slot_counts [L]): slot l's tokens are
    sorted_token_ids[slot_starts[l] : slot_starts[l] + slot_counts[l]].

    searchsorted rather than bincount: bincount on CUDA reads the maximum back to the host.
    """
    sorted_slots, sorted_token_ids = torch.sort(token_slots, stable=True)
    slot_ids = torch.arange(num_slots, dtype=token_slots.dtype, device=token_slots.device)
    slot_starts = torch.searchsorted(sorted_slots, slot_ids)
    slot_ends = torch.searchsorted(sorted_slots, slot_ids, right=True)
    return sorted_token_ids, slot_starts, slot_ends - slot_starts


def _block(size: int) -> int:
    """A tile side covering `size` with the fewest masked lanes, between 16 and 64."""
    return max(_MIN_BLOCK, min(_MAX_BLOCK, triton.next_power_of_2(size)))


def _check_shrink(x: torch.Tensor, lora_a: torch.Tensor, token_slots: torch.Tensor) -> None:
    _check_activation("x", x)
    _check_slot_weights("lora_a", lora_a, x)
    if lora_a.shape[2] != x.shape[1]:
        raise ValueError(
            f"lora_a is [L, W, in] with in = {lora_a.shape[2]}, x has {x.shape[1]} features"
        )
    _check_token_slots(token_slots, x)


def _check_expand(
    s: torch.Tensor, lora_b: torch.Tensor, token_slots: torch.Tensor, y: torch.Tensor
) -> None:
    _check_activation("y", y)
    if s.dim() != 2 or s.dtype != torch.float32:
        raise ValueError(f"s must be a float32 [T, W] tensor, got {s.dtype} {tuple(s.shape)}")
    _check_device("s", s, y)
    if s.shape[0] != y.shape[0]:
        raise ValueError(f"s has {s.shape[0]} rows, y has {y.shape[0]}")
    _check_slot_weights("lora_b", lora_b, y)
    if lora_b.shape[1] != s.shape[1]:
        raise ValueError(
            f"lora_b is [L, W, out] with W = {lora_b.shape[1]}, s has W = {s.shape[1]}"
        )
    if lora_b.shape[2] != y.shape[1]:
        raise ValueError(
            f"lora_b is [L, W, out] with out = {lora_b.shape[2]}, y has {y.shape[1]} features"
        )
    _check_token_slots(token_slots, y)


def _check_activation(name: str, tensor: torch.Tensor) -> None:
    if tensor.dtype not in _ACTIVATION_DTYPES:
        raise ValueError(f"{name} must be float16, bfloat16 or float32, got {tensor.dtype}")
    if tensor.dim() != 2:
        raise ValueError(f"{name} must be 2-D [T, features], got shape {tuple(tensor.shape)}")


def _check_slot_weights(name: str, weights: torch.Tensor, activation: torch.Tensor) -> None:
    """`weights` is [L, W, features] in the activation's dtype, on its device."""
    if weights.dim() != 3:
        raise ValueError(f"{name} must be 3-D [L, W, features], got shape {tuple(weights.shape)}")
    if weights.dtype != activation.dtype:
        raise ValueError(f"{name} is {weights.dtype}, the activations are {activation.dtype}")
    _check_device(name, weights, activation)


def _check_token_slots(token_slots: torch.Tensor, activation: torch.Tensor) -> None:
    if token_slots.dtype != torch.int64 or token_slots.dim() != 1:
        raise ValueError(
            f"token_slots must be a 1-D int64 tensor, got {token_slots.dtype} "
            f"{tuple(token_slots.shape)}"
        )
    if token_slots.shape[0] != activation.shape[0]:
        raise ValueError(
            f"token_slots has {token_slots.shape[0]} entries for {activation.shape[0]} tokens"
        )
    _check_device("token_slots", token_slots, activation)


def _check_device(name: str, tensor: torch.Tensor, activation: torch.Tensor) -> None:
    if tensor.device != activation.device:
        raise ValueError(f"{name} is on {tensor.device}, the activations on {activation.device}")
