"""core's kernel ops on the CPU, served by this package's C++ kernels.

`register` is this distribution's `core.general` entry point: every process that runs a
model calls it before building one. It serves core::rms_norm, core::fused_add_rms_norm,
core::linear (a GEMV that streams each weight row once for few-row activations, where
torch's BLAS runs a slow path), core::silu_and_mul, core::rotary_embedding (in place, in
the fused QKV's views) and core::quant_linear (group-quantized 4- and 8-bit weights: a
GEMV for decode rows that unpacks the weights in registers; past those, for bfloat16
activations on CPUs with AVX512_BF16, a strip GEMM on bf16 dot products from a copy of the
weight dequantized once (`quant_strips`), else a blocked GEMM for decode batches and a
tiled one for prefill; with CORE_CPU_INT8_ACTIVATIONS=1 bfloat16 activations take int8 dot
products instead: see `int8_activations`);
AVX-512, AVX2 or portable kernels, chosen by probing the CPU at load.
Inputs the C++ kernels do not take (another dtype, a weight of another dtype, a strided
last dimension, a non-contiguous packed weight) go to core's reference, so the registered
kernel serves the op's whole domain.
"""

from __future__ import annotations

import functools
import os

import torch

from core.ops import (
    fused_add_rms_norm_reference,
    linear_reference,
    quant_linear_reference,
    register_impl,
    rms_norm_reference,
    rotary_embedding_reference,
    silu_and_mul_reference,
)
from core.ops.quant_linear import num_inputs
from core.platforms.cpu import cpu_flags
from core_cpu_kernels import (
    _C,  # import after torch: the module links against libtorch
    packed_linear,
    weight_copies,
)

PROVIDER = "core-cpu-kernels"

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_QWEIGHT_DTYPES = {4: torch.uint8, 8: torch.int8}


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if _takes(x, weight):
        return _C.rms_norm(x, weight, eps)
    return rms_norm_reference(x, weight, eps)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    like_x = residual.shape == x.shape and residual.dtype is x.dtype
    if _takes(x, weight) and like_x and residual.stride(-1) == 1:
        return _C.fused_add_rms_norm(x, residual, weight, eps)
    return fused_add_rms_norm_reference(x, residual, weight, eps)


# Up to this many rows of float32 activations the GEMV beats torch's BLAS (MKL): measured
# with 2 threads on SmolLM2's shapes (AMD EPYC, AVX2), see dense_linear_max_rows.
FLOAT32_MAX_ROWS = 16
# CPU flags with which torch multiplies each 16-bit dtype natively (oneDNN's AMX /
# AVX512_BF16 / AVX512_FP16 paths): there the GEMV only takes FLOAT32_MAX_ROWS rows, as for
# float32. Without them torch's 16-bit matmul of more than one row is orders of magnitude
# slower than the GEMV, which widens the weights in registers, so it takes every row.
_NATIVE_FLAGS = {
    torch.bfloat16: frozenset({"amx_bf16", "avx512_bf16"}),
    torch.float16: frozenset({"amx_fp16", "avx512_fp16"}),
}


@functools.cache
def dense_linear_max_rows(dtype: torch.dtype) -> int | None:
    """The most activation rows core::linear's GEMV takes for `dtype` (None: any number)."""
    native = _NATIVE_FLAGS.get(dtype)
    if native is None or native & cpu_flags():
        return FLOAT32_MAX_ROWS
    return None


def linear(
    x: torch.Tensor,  # [..., K]
    weight: torch.Tensor,  # [N, K]
    bias: torch.Tensor | None = None,  # [N]
) -> torch.Tensor:  # [..., N]
    """core::linear: the GEMV (`_C.dense_linear`, widest ISA) for few rows of x in the
    weight's dtype and a contiguous weight; oneDNN on a packed copy of the weight for a
    float32 decode batch (packed_linear.py); torch (the reference) for everything else."""
    rows = x.numel() // x.shape[-1] if x.dim() and x.shape[-1] else 0
    max_rows = dense_linear_max_rows(x.dtype)
    takes = (
        x.dtype is weight.dtype
        and x.dtype in _DTYPES
        and weight.dim() == 2
        and weight.is_contiguous()
        and x.dim() >= 1
        and 0 < rows
        and (max_rows is None or rows <= max_rows)
        and (bias is None or (bias.dtype is x.dtype and bias.dim() == 1))
    )
    if takes:
        out = _C.dense_linear(x.reshape(rows, x.shape[-1]).contiguous(), weight, bias)
        return out.view(*x.shape[:-1], weight.shape[0])
    if _takes_packed(x, weight, bias, rows):
        packed = packed_linear.packed_weight(weight)
        if packed is not None:
            return packed_linear.linear(x, packed, bias)
    return linear_reference(x, weight, bias)


def _takes_packed(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, rows: int
) -> bool:
    """A decode batch of float32 rows for oneDNN's packed matmul (packed_linear.py)."""
    return (
        x.dtype is torch.float32
        and weight.dtype is torch.float32
        and weight.dim() == 2
        and FLOAT32_MAX_ROWS < rows <= packed_linear.MAX_ROWS
        and (bias is None or (bias.dtype is torch.float32 and bias.dim() == 1))
        and packed_linear.available()
    )


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:  # [T, 2I] -> [T, I]
    """One pass over 2-D x with a contiguous last dimension (rows may be strided)."""
    if x.dtype in _DTYPES and x.dim() == 2 and x.stride(-1) == 1 and x.shape[-1] % 2 == 0:
        return _C.silu_and_mul(x)
    return silu_and_mul_reference(x)


def rotary_embedding(
    positions: torch.Tensor,  # [T] int64
    query: torch.Tensor,  # [T, Hq, D]
    key: torch.Tensor,  # [T, Hkv, D]
    cos_cache: torch.Tensor,  # [max_positions, D / 2] float32
    sin_cache: torch.Tensor,
) -> None:
    """Rotates query and key where they lie (strided heads and rows of a fused QKV).

    Positions outside the tables raise RuntimeError before anything is written.
    """
    if _takes_rotary(positions, query, key, cos_cache, sin_cache):
        _C.rotary_embedding(positions, query, key, cos_cache, sin_cache)
    else:
        rotary_embedding_reference(positions, query, key, cos_cache, sin_cache)


def int8_activations() -> bool:
    """CORE_CPU_INT8_ACTIVATIONS=1 (read at each call; off by default): core::quant_linear
    multiplies bfloat16 activations on int8 dot products where the CPU has AVX512_VNNI
    (with AVX512_BF16), x quantized per token and run of 32 inputs. Its GEMMs are 1.2-1.4x
    faster (SmolLM2's layers), at a quality cost: the default model's perplexity rises
    0.24% (35.14 -> 35.22 on the held-out text; 35.59 before 4-bit values were counted from
    8) and its greedy answer to "What is the capital of France?" (whose two likeliest
    first tokens lie 0.09 apart in float32) changes, so it is never on unless asked for."""
    return os.environ.get("CORE_CPU_INT8_ACTIVATIONS", "") not in ("", "0")


def quant_linear(
    x: torch.Tensor,  # [T, K]
    qweight: torch.Tensor,
    scales: torch.Tensor,
    mins: torch.Tensor,
    bits: int,
) -> torch.Tensor:  # [T, N], x's dtype
    """core::quant_linear with the widest vector ISA this CPU runs (`_C.quant_linear_isas`).

    A strided x is copied once (the kernels read rows of K contiguous values); a malformed
    layout (shapes that are not one packed weight) raises RuntimeError from the kernel.
    """
    takes_weight = (
        qweight.dtype is _QWEIGHT_DTYPES.get(bits)
        and scales.dtype is torch.float32
        and mins.dtype is torch.float32
        and qweight.is_contiguous()
        and scales.is_contiguous()
        and mins.is_contiguous()
    )
    if takes_weight and x.dtype in _DTYPES and x.dim() == 2:
        int8_x = int8_activations()
        strips = None
        if x.dtype is torch.bfloat16 and x.shape[0] >= STRIP_MIN_ROWS and not int8_x:
            strips = quant_strips(qweight, scales, mins, bits)
        return _C.quant_linear(
            x.contiguous(), qweight, scales, mins, bits, int8_x=int8_x, strips=strips
        )
    return quant_linear_reference(x, qweight, scales, mins, bits)


# From this many rows on, bfloat16 x multiplies W's strips (`quant_strips`); fewer take the
# GEMV, whose single pass over the packed weight reads a third of the strips' bytes. SmolLM2's
# 30 layers in turn, AVX512_BF16 EPYC, 2 threads, GEMV vs strips: 1 token 4.6 vs 9.2 ms, 2
# 8.2-8.7 vs 8.5-9.2, 3 8.2 vs 8.3, 4 10.7-11.9 vs 9.2-10.0, 8 25.2 vs 13.4.
STRIP_MIN_ROWS = 4
_STRIP_ROWS = 64  # the strips' rows (quant_linear.h's kStripRows)


@functools.cache
def strips_available() -> bool:
    """Whether the widest ISA here multiplies strips (has bf16 dot products)."""
    return _C.quant_linear_has_strips()


def quant_strips(
    qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, bits: int
) -> torch.Tensor | None:
    """W dequantized once to bfloat16 in the strip GEMM's layout (a weight_copies.py copy),
    or None where this CPU has no bf16 dot products or the copy cannot be kept.

    Without it the GEMMs dequantize W at every call: from the copy, bf16 decode batches and
    prefills skip that. SmolLM2's 30 layers in turn (weights from memory), AVX512_BF16 EPYC,
    2 threads, the packed 4-bit weights (blocked GEMM to 32 tokens, then the strip GEMM) vs
    strips: 9 tokens 26.9 vs 14.2 ms, 16 25.2 vs 14.6, 32 30.2 vs 20.3, 64 48.8 vs 43.6, 128
    84.6 vs 78.7; its 49,152-row 8-bit head at 32 tokens 8.6 vs 5.9 ms; in the engine, 32
    streams' decode steps 12% shorter. The copy takes 2 bytes a weight (4-bit values ~0.6)."""
    if not strips_available():
        return None
    n, k = qweight.shape[0], num_inputs(qweight, bits)
    num_bytes = -(-n // _STRIP_ROWS) * _STRIP_ROWS * k * 2
    return weight_copies.copy_of(
        "bf16-strips",
        (qweight, scales, mins),
        num_bytes,
        lambda: _C.quant_linear_strips(qweight, scales, mins, bits),
    )


def register() -> None:
    """Serve core's kernel ops on "cpu" with this package's kernels (re-entrant)."""
    register_impl("rms_norm", "cpu", rms_norm, PROVIDER)
    register_impl("fused_add_rms_norm", "cpu", fused_add_rms_norm, PROVIDER)
    register_impl("linear", "cpu", linear, PROVIDER)
    register_impl("silu_and_mul", "cpu", silu_and_mul, PROVIDER)
    register_impl("rotary_embedding", "cpu", rotary_embedding, PROVIDER)
    register_impl("quant_linear", "cpu", quant_linear, PROVIDER)


def _takes(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the C++ kernel takes x and weight (else the reference serves them).

    It takes float32, bfloat16 or float16 x with a weight [hidden] of the same dtype, x's
    last dimension contiguous; its rows may be strided (a head-split view of a fused QKV).
    """
    if x.dtype not in _DTYPES or weight.dtype is not x.dtype or x.dim() == 0:
        return False
    return weight.shape == x.shape[-1:] and weight.is_contiguous() and x.stride(-1) == 1


def _takes_rotary(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_cache: torch.Tensor,
    sin_cache: torch.Tensor,
) -> bool:
    """Whether the C++ kernel takes these (else the reference serves them): q and k of one
    dtype of `_DTYPES`, [T, heads, D] with a contiguous last dimension; contiguous int64
    positions [T]; contiguous float32 tables [positions, D / 2] of equal shape."""
    heads = query.dtype in _DTYPES and key.dtype is query.dtype and query.dim() == key.dim() == 3
    if not heads or query.stride(-1) != 1 or key.stride(-1) != 1:
        return False
    tables = (
        cos_cache.dtype is sin_cache.dtype is torch.float32
        and cos_cache.dim() == 2
        and cos_cache.shape == sin_cache.shape
        and cos_cache.is_contiguous()
        and sin_cache.is_contiguous()
    )
    return (
        tables
        and positions.dtype is torch.int64
        and positions.dim() == 1
        and positions.is_contiguous()
        and query.shape[0] == key.shape[0] == positions.shape[0]
        and query.shape[2] == key.shape[2] == 2 * cos_cache.shape[1]
    )
