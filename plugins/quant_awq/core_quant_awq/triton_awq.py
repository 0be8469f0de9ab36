"""Triton GEMM over AutoAWQ GEMM-layout 4-bit weights: y = x @ W^T, W never materialized.

Each program computes one BLOCK_M x BLOCK_N output tile over one slice of K. A K step of
BLOCK_K rows lies inside a single quantization group (BLOCK_K divides the group size), so
the step reads one row of zero points and scales for its BLOCK_N outputs, multiplies x by
the small integers (q - z) -- exact in fp16, bf16 and fp32 -- and applies the scales to the
float32 partial product. No weight is ever rounded to the activation dtype; the only
roundings are fp32 accumulation and the final store in x's dtype.

Decode (few tokens) is bandwidth-bound and has few output tiles, so it splits K across
programs to occupy the GPU; the split partial sums are written to a float32 buffer and
summed by torch (deterministic, unlike atomics).

This module imports triton at the top: import it only where triton is available (the AWQ
method does so when it runs on a CUDA device). Under `TRITON_INTERPRET=1` (set before this
module is imported) the kernel runs on CPU tensors, which is how the tests check it. The kernel
calls only `triton.language` builtins, no `@triton.jit` library helpers such as `tl.zeros`:
those are decorated when triton is imported, so a process that imported triton before setting
TRITON_INTERPRET could not interpret them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

__all__ = ["AwqGemmConfig", "awq_gemm", "select_config"]

_PACK = 8  # 4-bit values per int32
_DECODE_MAX_TOKENS = 16
_TARGET_PROGRAMS = 256  # enough programs to keep every SM of a large GPU busy during decode
_MAX_BLOCK_K = 128
_MIN_BLOCK = 16  # tl.dot's smallest tile side


@dataclass(frozen=True)
class AwqGemmConfig:
    """Tile sizes and launch parameters of one `awq_gemm` launch.

    block_m, block_n, block_k: powers of two >= 16; block_k must divide the group size.
    split_k: how many programs share one output tile's K range (>= 1).
    """

    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3


@triton.jit
def _awq_gemm_kernel(
    x_ptr,  # [M, K]
    qweight_ptr,  # int32 [K, N / 8], contiguous
    qzeros_ptr,  # int32 [K / G, N / 8], contiguous
    scales_ptr,  # [K / G, N], contiguous
    out_ptr,  # [SPLIT_K, M, N], contiguous
    M,
    N,
    K,
    group_size,
    k_blocks_per_split,
    stride_xm,
    stride_xk,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    packed_n = N // 8
    packed_cols = offs_n // 8
    # AutoAWQ's order (0, 2, 4, 6, 1, 3, 5, 7): output 8c + j sits in nibble j // 2 when j is
    # even, 4 + j // 2 when odd.
    j = offs_n % 8
    shifts = ((j % 2) * 4 + j // 2) * 4

    acc = tl.full((BLOCK_M, BLOCK_N), 0.0, dtype=tl.float32)
    first_block = pid_k * k_blocks_per_split
    last_block = tl.minimum(first_block + k_blocks_per_split, K // BLOCK_K)
    for k_block in range(first_block, last_block):
        rows = k_block * BLOCK_K + offs_k
        x = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + rows[None, :] * stride_xk,
            mask=m_mask[:, None],
            other=0.0,
        )  # [BLOCK_M, BLOCK_K]
        packed = tl.load(
            qweight_ptr + rows[:, None] * packed_n + packed_cols[None, :],
            mask=n_mask[None, :],
            other=0,
        )  # [BLOCK_K, BLOCK_N], each int32 read once per output it holds
        group = (k_block * BLOCK_K) // group_size
        packed_zeros = tl.load(qzeros_ptr + group * packed_n + packed_cols, mask=n_mask, other=0)
        scales = tl.load(scales_ptr + group * N + offs_n, mask=n_mask, other=0.0)
        q = (packed >> shifts[None, :]) & 0xF
        zeros = (packed_zeros >> shifts) & 0xF
        w = (q - zeros[None, :]).to(x.dtype)  # integers in [-15, 15]: exact in any float
        partial = tl.dot(x, w, input_precision="ieee")  # ieee: no TF32 for fp32 inputs
        acc += partial * scales.to(tl.float32)[None, :]

    out = out_ptr + pid_k * M * N + offs_m[:, None] * N + offs_n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def select_config(
    num_tokens: int, out_features: int, in_features: int, group_size: int
) -> AwqGemmConfig:
    """The launch configuration `awq_gemm` uses for x [num_tokens, in_features].

    Decode (num_tokens <= 16): one 16-row tile and K split until about 256 programs run.
    Prefill: 64 x 64 tiles over the whole K range.
    """
    block_k = _largest_block_k(group_size)
    if num_tokens > _DECODE_MAX_TOKENS:
        return AwqGemmConfig(block_m=64, block_n=64, block_k=block_k)
    block_n = 64
    num_tiles = triton.cdiv(out_features, block_n)
    k_blocks = in_features // block_k
    split_k = max(1, min(k_blocks, _TARGET_PROGRAMS // num_tiles))
    return AwqGemmConfig(
        block_m=_MIN_BLOCK, block_n=block_n, block_k=block_k, split_k=split_k, num_stages=4
    )


def awq_gemm(
    x: torch.Tensor,  # [M, K] float16 / bfloat16 / float32
    qweight: torch.Tensor,  # int32 [K, N / 8]
    qzeros: torch.Tensor,  # int32 [K / G, N / 8]
    scales: torch.Tensor,  # [K / G, N]
    group_size: int,
    config: AwqGemmConfig | None = None,
) -> torch.Tensor:  # [M, N] in x's dtype
    """x @ W^T with W[n, k] = (q[n, k] - z[n, k // G]) * scales[k // G, n], fp32 accumulation.

    `config` overrides `select_config` (tuning, tests). All tensors must be on one device that
    triton can launch on (CUDA, or CPU under TRITON_INTERPRET=1).
    """
    _check_shapes(x, qweight, qzeros, scales, group_size)
    num_tokens, in_features = x.shape
    out_features = scales.shape[1]
    config = config or select_config(num_tokens, out_features, in_features, group_size)
    _check_config(config, group_size)
    out_dtype = x.dtype if config.split_k == 1 else torch.float32
    out = torch.empty(
        (config.split_k, num_tokens, out_features), dtype=out_dtype, device=x.device
    )  # [SPLIT_K, M, N]
    k_blocks = in_features // config.block_k
    grid = (
        triton.cdiv(num_tokens, config.block_m),
        triton.cdiv(out_features, config.block_n),
        config.split_k,
    )
    _awq_gemm_kernel[grid](
        x,
        qweight.contiguous(),
        qzeros.contiguous(),
        scales.contiguous(),
        out,
        num_tokens,
        out_features,
        in_features,
        group_size,
        triton.cdiv(k_blocks, config.split_k),
        x.stride(0),
        x.stride(1),
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    return out[0] if config.split_k == 1 else out.sum(dim=0).to(x.dtype)


def _largest_block_k(group_size: int) -> int:
    """The largest power of two <= 128 dividing group_size (so a K step stays in one group)."""
    block_k = min(group_size & -group_size, _MAX_BLOCK_K)
    if block_k < _MIN_BLOCK:
        raise ValueError(f"group_size {group_size} must be a multiple of {_MIN_BLOCK}")
    return block_k


def _check_config(config: AwqGemmConfig, group_size: int) -> None:
    for field in ("block_m", "block_n", "block_k"):
        value = getattr(config, field)
        if value < _MIN_BLOCK or value & (value - 1):
            raise ValueError(f"config.{field} = {value} must be a power of two >= {_MIN_BLOCK}")
    if group_size % config.block_k:
        raise ValueError(f"config.block_k = {config.block_k} must divide group_size {group_size}")
    if config.split_k < 1:
        raise ValueError(f"config.split_k = {config.split_k} must be >= 1")


def _check_shapes(
    x: torch.Tensor,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
) -> None:
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"x must be float16, bfloat16 or float32, got {x.dtype}")
    for name, tensor in (("qweight", qweight), ("qzeros", qzeros)):
        if tensor.dtype != torch.int32:
            raise TypeError(f"{name} must be int32, got {tensor.dtype}")
    if x.dim() != 2 or qweight.dim() != 2 or scales.dim() != 2:
        raise ValueError("x, qweight and scales must be 2-D")
    in_features, out_features = qweight.shape[0], qweight.shape[1] * _PACK
    if x.shape[1] != in_features:
        raise ValueError(f"x has {x.shape[1]} features, qweight has {in_features} rows")
    if group_size <= 0 or in_features % group_size:
        raise ValueError(f"group_size {group_size} does not divide in_features {in_features}")
    num_groups = in_features // group_size
    if tuple(scales.shape) != (num_groups, out_features):
        raise ValueError(f"scales shape {tuple(scales.shape)} != {(num_groups, out_features)}")
    if tuple(qzeros.shape) != (num_groups, out_features // _PACK):
        raise ValueError(
            f"qzeros shape {tuple(qzeros.shape)} != {(num_groups, out_features // _PACK)}"
        )
