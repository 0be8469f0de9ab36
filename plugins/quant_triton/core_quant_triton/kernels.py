"""Triton kernel of core::quant_linear: x W^T over core's packed 4/8-bit layout.

A program takes BLOCK_M rows of x and BLOCK_N outputs, and walks its split's share of K
in steps of BLOCK_K inputs that lie inside one group, with a float32 accumulator. A step
adds s * (x . q) + m * sum(x) for its group's scales s and mins m (W = s * q + m): the
values q go to x's dtype, where they are exact (|q| <= 128), so tl.dot multiplies
exactly and sums in float32, and W is never formed. A 4-bit step of BLOCK_K inputs reads
BLOCK_K / 2 bytes per output, each once: its low nibbles hold inputs 0..15 of each run of
32 and its high nibbles inputs 16..31, so the step is two dots, each of the nibbles with
the columns of x they multiply. 8-bit values are one int8 each, one dot.

This module imports triton at the top: import it only where triton is available. Under
`TRITON_INTERPRET=1` (set before this module is imported) the kernel runs on CPU tensors,
which is how the tests check it; the interpreter cannot multiply bfloat16 tiles, so there
bfloat16 tiles are converted to float32 before each `tl.dot`. The kernel calls only
`triton.language` builtins, no `@triton.jit` library helpers such as `tl.zeros`,
`tl.cdiv` or `tl.sum`: those are decorated when triton is imported, so a process that
imported triton before setting TRITON_INTERPRET could not interpret them. Sums over a
tile reduce with this module's own `_add`, decorated as this module is loaded.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from core_quant_triton.ops import Tiles

__all__ = ["quant_gemm"]

_INTERPRETED = triton.knobs.runtime.interpret  # as `@triton.jit` saw it below


@triton.jit
def _add(a, b):
    """tl.reduce's combine function for a sum."""
    return a + b


@triton.jit
def _quant_gemm_kernel(
    out_ptr,  # [SPLIT_K, M, N]: float32 partial sums, or x's dtype when SPLIT_K is 1
    x_ptr,  # [M, K]
    qweight_ptr,  # uint8 [N, K / 2] (4 bits) or int8 [N, K] (8 bits)
    scales_ptr,  # float32 [N, K / G]
    mins_ptr,  # float32 [N, K / G]
    M,
    N,
    group_size,
    num_steps,  # K / BLOCK_K
    steps_per_split,
    stride_xm,
    stride_xk,
    stride_qn,
    stride_qk,
    stride_sn,
    stride_sg,
    stride_mn,
    stride_mg,
    stride_os,
    stride_om,
    stride_on,
    BITS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """Program (row block, column block, split): the split's float32 sum of its K steps."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    split = tl.program_id(2)
    row_in = rows < M
    col_in = cols < N
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_xm  # [BLOCK_M, 1]
    q_cols = qweight_ptr + cols.to(tl.int64)[None, :] * stride_qn  # [1, BLOCK_N]
    s_cols = scales_ptr + cols.to(tl.int64) * stride_sn
    m_cols = mins_ptr + cols.to(tl.int64) * stride_mn
    if BITS == 4:
        nbytes = tl.arange(0, BLOCK_K // 2)  # a step's bytes of one output's row
        low_ks = (nbytes // 16) * 32 + nbytes % 16  # the input in each byte's low nibble
    else:
        ks = tl.arange(0, BLOCK_K)
    acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
    first = split * steps_per_split
    for step in range(first, tl.minimum(first + steps_per_split, num_steps)):
        start = step * BLOCK_K
        group = start // group_size  # the whole step's: BLOCK_K divides group_size
        scales = tl.load(s_cols + group * stride_sg, mask=col_in, other=0.0)
        mins = tl.load(m_cols + group * stride_mg, mask=col_in, other=0.0)
        if BITS == 4:
            low_ptrs = x_rows + (start + low_ks)[None, :] * stride_xk
            x_low = tl.load(low_ptrs, mask=row_in[:, None], other=0.0)
            x_high = tl.load(low_ptrs + 16 * stride_xk, mask=row_in[:, None], other=0.0)
            packed = tl.load(
                q_cols + (start // 2 + nbytes)[:, None] * stride_qk, mask=col_in[None, :], other=0
            )  # [BLOCK_K / 2, BLOCK_N]
            if UPCAST:
                x_low = x_low.to(tl.float32)
                x_high = x_high.to(tl.float32)
            low = (packed & 0xF).to(x_low.dtype)
            high = (packed >> 4).to(x_low.dtype)
            dots = tl.dot(x_low, low, input_precision="ieee")  # ieee: no TF32 for float32
            dots = tl.dot(x_high, high, acc=dots, input_precision="ieee")
            x_sums = tl.reduce(x_low.to(tl.float32) + x_high.to(tl.float32), 1, _add)
        else:
            x = tl.load(x_rows + (start + ks)[None, :] * stride_xk, mask=row_in[:, None], other=0.0)
            q = tl.load(q_cols + (start + ks)[:, None] * stride_qk, mask=col_in[None, :], other=0)
            if UPCAST:
                x = x.to(tl.float32)
            dots = tl.dot(x, q.to(x.dtype), input_precision="ieee")
            x_sums = tl.reduce(x.to(tl.float32), 1, _add)
        acc += dots * scales[None, :] + x_sums[:, None] * mins[None, :]
    out_ptrs = (
        out_ptr
        + split.to(tl.int64) * stride_os
        + rows.to(tl.int64)[:, None] * stride_om
        + cols[None, :] * stride_on
    )
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=row_in[:, None] & col_in[None, :])


def quant_gemm(
    out: torch.Tensor,  # [tiles.split_k, M, N]: float32, or x's dtype when split_k is 1
    x: torch.Tensor,  # [M, K]
    qweight: torch.Tensor,
    scales: torch.Tensor,
    mins: torch.Tensor,
    bits: int,
    tiles: Tiles,
) -> None:
    """Write each split's share of x W^T (all of it when tiles.split_k is 1) to out[split]."""
    rows, inputs = x.shape
    outputs = qweight.shape[0]
    group = inputs // scales.shape[1]
    num_steps = inputs // tiles.block_k
    steps_per_split = triton.cdiv(num_steps, tiles.split_k)
    grid = (
        triton.cdiv(rows, tiles.block_m),
        triton.cdiv(outputs, tiles.block_n),
        tiles.split_k,
    )
    _quant_gemm_kernel[grid](
        out,
        x,
        qweight,
        scales,
        mins,
        rows,
        outputs,
        group,
        num_steps,
        steps_per_split,
        *x.stride(),
        *qweight.stride(),
        *scales.stride(),
        *mins.stride(),
        *out.stride(),
        BITS=bits,
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n,
        BLOCK_K=tiles.block_k,
        UPCAST=_INTERPRETED and x.dtype == torch.bfloat16,
    )
