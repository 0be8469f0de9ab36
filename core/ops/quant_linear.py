"""Group-quantized linear: the one packed weight layout core's 4- and 8-bit methods share.

Every quantized weight core multiplies on the CPU (AWQ's 4-bit, GGUF's Q4_0 / Q4_1 /
Q4_K / Q5_K / Q6_K / Q8_0 blocks) is held in this layout, so one kernel family serves them
all; each method converts its checkpoint's format into it once, after loading.

The layout of a weight W [N, K] (N outputs, K inputs) with `bits` 4 or 8 and group size G
(K % G == 0) is three tensors:

- `qweight`: the quantized values q[n, k], row-major.
  - bits 4: uint8 [N, K / 2], unsigned values 0..15. K is cut into runs of 32; value j of
    run r sits in byte 16 r + (j mod 16) of the row, in its low nibble for j < 16 and its
    high nibble for j >= 16 (ggml's Q4_0 / Q4_1 order inside a block). G % 32 == 0.
  - bits 8: int8 [N, K], signed values. G % 16 == 0.
- `scales`, `mins`: float32 [N, K / G]; the group of k is k // G.

    W[n, k] = scales[n, k // G] * q[n, k] + mins[n, k // G]

float32 scales and mins keep every source format exact: AWQ's (q - zero) * scale is
scale * q + (-zero * scale), each product exact in float32 and the exact difference
representable; ggml's half-precision block scales are exact in float32 too.

`core::quant_linear(x, qweight, scales, mins, bits)` computes x W^T with float32
accumulation and rounds once to x's dtype (float32, bfloat16 or float16). Its reference
dequantizes W and multiplies in float32; a kernel (core-cpu-kernels registers one for the
CPU) must equal it up to float32 summation order, and must not materialize all of W for a
call (it may keep a copy of W in its own layout, made once and remade when the packed
tensors are written, as core-cpu-kernels keeps bfloat16 ones).
For bfloat16 x a kernel may also round W to bfloat16 (to multiply with native bf16 dot
products, as a bf16 model's dense weights are stored): each product then errs by at most
2^-9 of its magnitude. Or, where W's groups are whole runs of 32 inputs, it may quantize x
to int8 per token and run of 32 inputs (to multiply with int8 dot products, as llama.cpp
multiplies its 4-bit blocks): dx = max |x[run]| / 127, xq = round(x * (127 / max |x[run]|))
to nearest even, so each input errs by at most max |x[run]| / 254; (q - c) . xq is then
exact, and each group's min + c * scale multiplies x's exact sum. The centre c is 0 or, for
4-bit values, 8: then the rounding of x errs along scale * (q - 8), W's distance from the
middle of its group's range, rather than along W (on SmolLM2's GGUF, perplexity of the
benchmarks' held-out text with x in bf16 35.14, int8 counted from 0 35.59, from 8 35.22).
"""

from __future__ import annotations

import torch

from core import batch_invariant
from core.ops.registry import CORE_OPS
from core.ops.samples import Conformance, OpSample, Tolerance, randn

_RUN = 32  # 4-bit values are packed in runs of 32 inputs, 16 bytes each
BITS = (4, 8)


def group_unit(bits: int) -> int:
    """What every group size of `bits`-bit values is a multiple of: whole runs of 32
    inputs for 4 bits, 16 inputs for 8."""
    return _RUN if bits == 4 else 16


def group_size(qweight: torch.Tensor, scales: torch.Tensor, bits: int) -> int:
    """G of a packed weight: its number of inputs over its number of groups per row."""
    return num_inputs(qweight, bits) // scales.shape[1]


def num_inputs(qweight: torch.Tensor, bits: int) -> int:
    """K of a packed weight."""
    return qweight.shape[1] * 8 // bits


def check_layout(
    qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, bits: int, name: str
) -> None:
    """ValueError naming `name` (the layer) when the tensors are not one packed weight."""
    if bits not in BITS:
        raise ValueError(f"{name}: bits must be one of {BITS}, got {bits}")
    want_dtype = torch.uint8 if bits == 4 else torch.int8
    if qweight.dtype != want_dtype or qweight.dim() != 2:
        raise ValueError(f"{name}: qweight must be a 2-D {want_dtype} tensor for {bits}-bit values")
    if scales.dtype != torch.float32 or mins.dtype != torch.float32:
        raise ValueError(f"{name}: scales and mins must be float32")
    n, k = qweight.shape[0], num_inputs(qweight, bits)
    if scales.dim() != 2 or scales.shape[0] != n or scales.shape != mins.shape:
        raise ValueError(
            f"{name}: scales {tuple(scales.shape)} and mins {tuple(mins.shape)} must both be "
            f"[{n}, groups]"
        )
    groups = scales.shape[1]
    unit = group_unit(bits)
    if groups == 0 or k % groups or (k // groups) % unit:
        raise ValueError(
            f"{name}: {groups} groups do not cut {k} inputs into groups of a multiple of {unit}"
        )


def pack(q: torch.Tensor, bits: int) -> torch.Tensor:
    """Quantized values q [N, K] (integers in range for `bits`) -> qweight."""
    if bits == 8:
        return q.to(torch.int8)
    n, k = q.shape
    if k % _RUN:
        raise ValueError(f"4-bit rows must hold a multiple of {_RUN} values, got {k}")
    runs = q.to(torch.uint8).reshape(n, k // _RUN, 2, _RUN // 2)  # [N, R, low|high, 16]
    return (runs[:, :, 0] | (runs[:, :, 1] << 4)).reshape(n, k // 2)


def unpack(qweight: torch.Tensor, bits: int) -> torch.Tensor:
    """qweight -> the quantized values q [N, K] as int16 (the inverse of `pack`)."""
    if bits == 8:
        return qweight.to(torch.int16)
    n = qweight.shape[0]
    runs = qweight.reshape(n, -1, _RUN // 2)  # [N, R, 16]
    values = torch.stack((runs & 0x0F, runs >> 4), dim=2)  # [N, R, 2, 16]
    return values.reshape(n, -1).to(torch.int16)


def dequantize(
    qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, bits: int
) -> torch.Tensor:
    """W [N, K] in float32."""
    q = unpack(qweight, bits).float()
    n, k = q.shape
    groups = scales.shape[1]
    w = q.reshape(n, groups, k // groups) * scales[..., None] + mins[..., None]
    return w.reshape(n, k)


def dequantize_rows(
    rows: torch.Tensor,  # [T] int64 row indices
    qweight: torch.Tensor,
    scales: torch.Tensor,
    mins: torch.Tensor,
    bits: int,
) -> torch.Tensor:  # [T, K] float32
    """The rows `rows` of W, dequantized: an embedding lookup that reads only those rows."""
    return dequantize(qweight[rows], scales[rows], mins[rows], bits)


def quant_linear_reference(
    x: torch.Tensor,  # [T, K]
    qweight: torch.Tensor,
    scales: torch.Tensor,
    mins: torch.Tensor,
    bits: int,
) -> torch.Tensor:  # [T, N], x.dtype
    """x W^T, dequantized W, float32 products and sums, rounded once to x's dtype (row by
    row in batch-invariant mode)."""
    weight = dequantize(qweight, scales, mins, bits)
    if batch_invariant.enabled():
        return batch_invariant.rowwise(_times_transposed, (x,), weight)
    return _times_transposed(x, weight)


def _times_transposed(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return (x.float() @ weight.T).to(x.dtype)


def _quant_linear_fake(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, bits: int
) -> torch.Tensor:
    return x.new_empty((x.shape[0], qweight.shape[0]))


# A kernel sums in another order (and may group the sum as scale * sum(q x) + min * sum(x)):
# float32 error up to a few units of float32 precision of |x| @ |W|^T, which is at most ~80
# on the samples below, hence the absolute term; half types are rounded once more, and
# bfloat16 x may multiply W rounded to bfloat16 (up to 2^-9 of |x| @ |W|^T more) or be
# quantized to int8 where W's groups are whole runs of 32 (up to the sum over runs of
# max |x[run]| / 254 * sum |scale * (q - c)| over the run: 0.36 at most on the samples
# below, against 0.15 at most for W in bf16).
_SUM_ORDER_ATOL = 1e-4
_BF16_ATOL = 0.4
TOLERANCES = {
    torch.float32: Tolerance(rtol=1e-5, atol=_SUM_ORDER_ATOL),
    torch.bfloat16: Tolerance(rtol=torch.finfo(torch.bfloat16).eps, atol=_BF16_ATOL),
    torch.float16: Tolerance(rtol=torch.finfo(torch.float16).eps, atol=_SUM_ORDER_ATOL),
}


def _sample_weight(
    n: int, k: int, bits: int, group: int, device: torch.device, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A random packed weight [n, k]: AWQ-like scales and zero points (mins = -zero * scale)."""
    generator = torch.Generator().manual_seed(seed)
    low, high = (0, 16) if bits == 4 else (-128, 128)
    q = torch.randint(low, high, (n, k), generator=generator)
    scales = torch.rand(n, k // group, generator=generator) * 0.02 + 1e-3
    zeros = torch.randint(0, 16, (n, k // group), generator=generator).float()
    return pack(q, bits).to(device), scales.to(device), (-zeros * scales).to(device)


def _quant_linear_samples(dtype: torch.dtype, device: torch.device) -> list[OpSample]:
    def sample(name: str, x: torch.Tensor, n: int, bits: int, group: int) -> OpSample:
        weight = _sample_weight(n, x.shape[1], bits, group, device, seed=1)
        return OpSample(name, (x, *weight, bits))

    rows = randn((3, 96), dtype, device, seed=0)
    return [
        sample("one row, 4-bit, groups of 32", randn((1, 64), dtype, device, 0), 7, 4, 32),
        sample("5 rows, 8-bit, groups of 16", randn((5, 96), dtype, device, 0), 7, 8, 16),
        sample("strided rows, 4-bit, one group", rows[:, :64], 9, 4, 64),
        sample("one output, 8-bit, groups of 32", randn((2, 64), dtype, device, 0), 1, 8, 32),
        # A decode batch's rows: kernels may multiply these by another path (a GEMM).
        sample("33 rows, 4-bit, groups of 32", randn((33, 96), dtype, device, 0), 50, 4, 32),
    ]


QUANT_LINEAR = CORE_OPS.declare(
    "quant_linear(Tensor x, Tensor qweight, Tensor scales, Tensor mins, int bits) -> Tensor",
    quant_linear_reference,
    _quant_linear_fake,
    Conformance(_quant_linear_samples, TOLERANCES),
)


def quant_linear(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, bits: int
) -> torch.Tensor:
    """`core::quant_linear` through the kernel serving x's device type (see QUANT_LINEAR)."""
    return QUANT_LINEAR(x, qweight, scales, mins, bits)
