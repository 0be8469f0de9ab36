"""FP8-weight linear (W8A16): x W^T with W held in 8-bit floats, x in its own dtype.

The layout of a weight W [N, K] (N outputs, K inputs) with input blocks of `block_k` is:

- `weight`: float8_e4m3fn [N, K], the values as the checkpoint stores them;
- `scales`: float32 [N, ceil(K / block_k)], the scale of each row and block of inputs.

    W[n, k] = float32(weight[n, k]) * scales[n, k // block_k]   (one float32 product)

Per-tensor and per-channel scales are one column (block_k = K); DeepSeek's 128x128
blocks are each block's scale repeated on its 128 rows. Holding scales per row keeps every
checkpoint's W exact, fused shards with scales of their own included.

`core::fp8_linear(x, weight, scales, block_k)` computes x W^T with float32 products and
sums, rounded once to x's dtype. Its reference dequantizes W one tile of rows at a time,
so no more than a tile of W is ever held in float32: 1 byte per weight, not 2 or 4, is
what the layout is for. A kernel must equal it up to float32 summation order, and for
bfloat16 x may round W to bfloat16 (as core::quant_linear allows), and must not
materialize all of W for a call.
"""

from __future__ import annotations

import torch

from core import batch_invariant
from core.ops.registry import CORE_OPS
from core.ops.samples import Conformance, OpSample, Tolerance, randn

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8_DTYPE).max  # 448
# Rows of W dequantized at a time: a tile of 256 rows of 4096 float32 inputs is 4 MiB,
# about what a core's share of the last-level cache holds.
TILE_ROWS = 256


def num_blocks(size: int, block: int) -> int:
    """Blocks of `block` covering `size` (the last one may be partial, as DeepSeek's are)."""
    return -(-size // block)


def dequantize(
    weight: torch.Tensor,  # float8_e4m3fn [N, K]
    scales: torch.Tensor,  # float32 [N, ceil(K / block_k)]
    block_k: int,
) -> torch.Tensor:  # [N, K] float32
    """W in float32."""
    k = weight.shape[1]
    per_input = scales.repeat_interleave(block_k, dim=1)[:, :k]  # [N, K]
    return weight.float() * per_input


def quantize(
    w: torch.Tensor,  # [N, K], any float dtype
    block_n: int,
    block_k: int,
) -> tuple[torch.Tensor, torch.Tensor]:  # (float8_e4m3fn [N, K], float32 [N/bn, K/bk])
    """W quantized to e4m3 per block of `block_n` x `block_k` (rounded up at the edges):
    each block's scale maps its largest |W| onto the largest e4m3 value, 448. A block of
    zeros gets scale 0. (1, K) blocks are per-channel scales, (N, K) one per tensor."""
    n, k = w.shape
    rows, cols = num_blocks(n, block_n), num_blocks(k, block_k)
    padded = w.float().new_zeros(rows * block_n, cols * block_k)
    padded[:n, :k] = w.float()
    blocks = padded.reshape(rows, block_n, cols, block_k)
    scales = blocks.abs().amax(dim=(1, 3)) / FP8_MAX  # [rows, cols]
    # A zero scale divides zeros: keep them zeros rather than NaNs.
    divisor = torch.where(scales > 0, scales, 1.0)[:, None, :, None]
    values = (blocks / divisor).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return values.reshape(rows * block_n, cols * block_k)[:n, :k].contiguous(), scales


def fp8_linear_reference(
    x: torch.Tensor,  # [T, K]
    weight: torch.Tensor,  # float8_e4m3fn [N, K]
    scales: torch.Tensor,  # float32 [N, ceil(K / block_k)]
    block_k: int,
) -> torch.Tensor:  # [T, N], x.dtype
    """x W^T, W dequantized TILE_ROWS rows at a time, float32 sums rounded once (row by
    row in batch-invariant mode)."""
    if batch_invariant.enabled():
        return batch_invariant.rowwise(_fp8_linear, (x,), weight, scales, block_k)
    return _fp8_linear(x, weight, scales, block_k)


def _fp8_linear(
    x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, block_k: int
) -> torch.Tensor:
    out = x.new_empty((x.shape[0], weight.shape[0]))
    x32 = x.float()
    for start in range(0, weight.shape[0], TILE_ROWS):
        rows = slice(start, start + TILE_ROWS)
        out[:, rows] = x32 @ dequantize(weight[rows], scales[rows], block_k).T
    return out


def _fp8_linear_fake(
    x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, block_k: int
) -> torch.Tensor:
    return x.new_empty((x.shape[0], weight.shape[0]))


# A kernel sums in another order: float32 error up to a few units of float32 precision of
# |x| @ |W|^T (at most ~50 on the samples below), hence the absolute term; half types are
# rounded once more, and bfloat16 x may multiply W rounded to bfloat16 (up to 2^-9 of
# |x| @ |W|^T more: 0.1 at most on the samples).
_SUM_ORDER_ATOL = 1e-4
TOLERANCES = {
    torch.float32: Tolerance(rtol=1e-5, atol=_SUM_ORDER_ATOL),
    torch.bfloat16: Tolerance(rtol=torch.finfo(torch.bfloat16).eps, atol=0.2),
    torch.float16: Tolerance(rtol=torch.finfo(torch.float16).eps, atol=_SUM_ORDER_ATOL),
}


def _fp8_linear_samples(dtype: torch.dtype, device: torch.device) -> list[OpSample]:
    def sample(name: str, x: torch.Tensor, n: int, block_n: int, block_k: int) -> OpSample:
        """x times a random W [n, K] quantized per block, its scales spread per row."""
        w = randn((n, x.shape[1]), torch.float32, torch.device("cpu"), seed=1)
        weight, scales = quantize(w, block_n, block_k)
        rows = scales.repeat_interleave(block_n, dim=0)[:n]
        return OpSample(name, (x, weight.to(device), rows.to(device), block_k))

    rows = randn((3, 96), dtype, device, seed=0)
    return [
        sample("one row, per-channel scales", randn((1, 64), dtype, device, 0), 7, 1, 64),
        sample("5 rows, 16x16 blocks", randn((5, 96), dtype, device, 0), 48, 16, 16),
        sample("strided rows, blocks cut at the edges", rows[:, :40], 9, 4, 16),
        sample("one output, per-tensor scale", randn((2, 64), dtype, device, 0), 1, 1, 64),
        # Past one tile of rows, and a decode batch kernels may multiply another way.
        sample("33 rows, two tiles", randn((33, 32), dtype, device, 0), TILE_ROWS + 5, 128, 16),
    ]


FP8_LINEAR = CORE_OPS.declare(
    "fp8_linear(Tensor x, Tensor weight, Tensor scales, int block_k) -> Tensor",
    fp8_linear_reference,
    _fp8_linear_fake,
    Conformance(_fp8_linear_samples, TOLERANCES),
)


def fp8_linear(
    x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, block_k: int
) -> torch.Tensor:
    """`core::fp8_linear` through the kernel serving x's device type (see FP8_LINEAR)."""
    return FP8_LINEAR(x, weight, scales, block_k)
