"""Int8 linear (W8A8): int8 weights times activations quantized to int8 per token at run time.

`core::int8_linear(x, weight, weight_scale)` takes x [T, K] (float32, bfloat16 or
float16), `weight` int8 [N, K] (signed values, symmetric: no zero point) and
`weight_scale` float32 [N], one per output row (W = weight_scale[n] * weight[n, k]). Each
token's row of x is quantized symmetrically to int8 (`quantize_per_token`):

    sx[t] = max_k |x[t, k]| / 127,   xq[t, k] = round(x[t, k] * 127 / max_k |x[t, k]|)

rounded to nearest even, within [-127, 127] (a row of zeros is zeros, sx 0). Then

    y[t, n] = (sum_k xq[t, k] * weight[n, k]) * sx[t] * weight_scale[n]

with the sum exact (every product and partial sum an integer of |.| <= 127^2 K, exact in
int32 up to K ~ 133,000) and y rounded once to x's dtype. The reference sums in float64
(exact) one tile of rows at a time, so no more than a tile of W is ever widened.

`quantize_per_token` is the one definition of xq and sx: a kernel calls it, or reproduces it
exactly, and may then sum in int32 (exact), or in float32 (exact products; partial sums
past 2^24 rounded), and for bfloat16 x may round the sums to bfloat16 once before the
scales (torch's int8-weight GEMM returns bfloat16 sums). What differs from the float model
is the rounding of x: each input errs by at most max |x[t]| / 254, which a method holds
its reference to (`LinearMethod.rounded_input`).
"""

from __future__ import annotations

import torch

from core import batch_invariant
from core.ops.registry import CORE_OPS
from core.ops.samples import Conformance, OpSample, Tolerance, randn

INT8_MAX = 127  # symmetric: -128 is never used, so -x quantizes to -xq
# Rows of W widened to float64 at a time by the reference: 256 rows of 4096 inputs is 8 MiB.
TILE_ROWS = 256


def quantize_per_token(
    x: torch.Tensor,  # [T, K]
) -> tuple[torch.Tensor, torch.Tensor]:  # (xq int8 [T, K], sx float32 [T, 1])
    """x's rows quantized to int8, each by its own largest |x| (see the module docstring)."""
    x32 = x.float()
    amax = x32.abs().amax(dim=1, keepdim=True)  # [T, 1]
    # Any factor quantizes a row of zeros to zeros; 1 keeps the product finite.
    factor = INT8_MAX / torch.where(amax > 0, amax, 1.0)
    xq = torch.round(x32 * factor).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return xq, amax / INT8_MAX


def scale_sums(
    sums: torch.Tensor,  # [T, N] integer sums (any int or float dtype)
    x_scale: torch.Tensor,  # float32 [T, 1]
    weight_scale: torch.Tensor,  # float32 [N]
    dtype: torch.dtype,
) -> torch.Tensor:  # [T, N] dtype
    """The sums times both scales in float32, rounded once to `dtype`: a kernel's last step."""
    return (sums.float() * x_scale * weight_scale).to(dtype)


def int8_linear_reference(
    x: torch.Tensor,  # [T, K]
    weight: torch.Tensor,  # int8 [N, K]
    weight_scale: torch.Tensor,  # float32 [N]
) -> torch.Tensor:  # [T, N], x.dtype
    """Exact integer sums (float64), scaled and rounded once to x's dtype (row by row in
    batch-invariant mode)."""
    if batch_invariant.enabled():
        return batch_invariant.rowwise(_int8_linear, (x,), weight, weight_scale)
    return _int8_linear(x, weight, weight_scale)


def _int8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    xq, x_scale = quantize_per_token(x)
    xq64 = xq.double()
    out = x.new_empty((x.shape[0], weight.shape[0]))
    for start in range(0, weight.shape[0], TILE_ROWS):
        rows = slice(start, start + TILE_ROWS)
        sums = xq64 @ weight[rows].double().T  # [T, tile]
        out[:, rows] = (sums * x_scale.double() * weight_scale[rows].double()).to(x.dtype)
    return out


def _int8_linear_fake(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor
) -> torch.Tensor:
    return x.new_empty((x.shape[0], weight.shape[0]))


# float32: sums past 2^24 and the two scale products round (a few units of float32
# precision). bfloat16: the sums may be rounded to bfloat16 before the scales, then the
# result is rounded again: two roundings of up to 2^-8 each. float16: one rounding.
TOLERANCES = {
    torch.float32: Tolerance(rtol=1e-5, atol=1e-5),
    torch.bfloat16: Tolerance(rtol=2 * torch.finfo(torch.bfloat16).eps, atol=1e-3),
    torch.float16: Tolerance(rtol=torch.finfo(torch.float16).eps, atol=1e-4),
}


def _sample_weight(n: int, k: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A random int8 W [n, k] with per-row scales like a checkpoint's (|W| ~ 0.01)."""
    generator = torch.Generator().manual_seed(1)
    weight = torch.randint(-INT8_MAX, INT8_MAX + 1, (n, k), generator=generator)
    scales = torch.rand(n, generator=generator) * 2e-4 + 1e-5
    return weight.to(device=device, dtype=torch.int8), scales.to(device)


def _int8_linear_samples(dtype: torch.dtype, device: torch.device) -> list[OpSample]:
    def sample(name: str, x: torch.Tensor, n: int) -> OpSample:
        return OpSample(name, (x, *_sample_weight(n, x.shape[1], device)))

    rows = randn((3, 96), dtype, device, seed=0)
    zero_row = randn((3, 64), dtype, device, seed=0)
    zero_row[1] = 0
    return [
        sample("one row", randn((1, 64), dtype, device, 0), 7),
        sample("5 rows, inputs not a multiple of 8", randn((5, 36), dtype, device, 0), 9),
        sample("strided rows", rows[:, :64], 9),
        sample("a row of zeros", zero_row, 5),
        sample("one output", randn((2, 64), dtype, device, 0), 1),
        # A decode batch's rows, past one tile of W's rows: kernels may multiply these
        # another way (a GEMM).
        sample("33 rows, two tiles", randn((33, 96), dtype, device, 0), TILE_ROWS + 5),
    ]


INT8_LINEAR = CORE_OPS.declare(
    "int8_linear(Tensor x, Tensor weight, Tensor weight_scale) -> Tensor",
    int8_linear_reference,
    _int8_linear_fake,
    Conformance(_int8_linear_samples, TOLERANCES),
)


def int8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """`core::int8_linear` through the kernel serving x's device type (see INT8_LINEAR)."""
    return INT8_LINEAR(x, weight, weight_scale)
