"""core's kernel ops on the CPU, served by this package's C++ kernels.

`register` is this distribution's `core.general` entry point: every process that runs a
model calls it before building one. It serves core::rms_norm, core::fused_add_rms_norm,
core::silu_and_mul, core::rotary_embedding (in place, in the fused QKV's views),
core::linear, core::quant_linear (group-quantized 4- and 8-bit weights), core::fp8_linear
(float8_e4m3fn weights, kept at one byte) and core::fused_moe. The three linear ops and
fused_moe each have several kernels (candidates.py) among which the worker chooses, per
weight shape and row count, the one measured fastest on this CPU (core.kernel_choice).
The C++ kernels use the widest vector ISA the CPU runs (AVX-512, AVX2 or portable code),
found by probing it at load.
Inputs the C++ kernels do not take (another dtype, a weight of another dtype, a strided
last dimension, a non-contiguous packed weight) go to core's reference, so the registered
kernel serves the op's whole domain.
It also offers models a layer stack (layer_stack.py): a step of decode rows through plain
decoder layers in one C++ call.
"""

from __future__ import annotations

import torch

from core.kernel_choice import KERNEL_CHOICES
from core.ops import (
    fp8_linear_reference,
    fused_add_rms_norm_reference,
    fused_moe_reference,
    linear_reference,
    quant_linear_reference,
    register_impl,
    rms_norm_reference,
    rotary_embedding_reference,
    silu_and_mul_reference,
)
from core_cpu_kernels import (
    _C,  # import after torch: the module links against libtorch
    candidates,
)

PROVIDER = "core-cpu-kernels"

DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # the activations the kernels take
_QWEIGHT_DTYPES = {4: torch.uint8, 8: torch.int8}
_FP8_WEIGHT_DTYPE = torch.float8_e4m3fn
_MOE_DTYPES = (torch.float32, torch.bfloat16)


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


def linear(
    x: torch.Tensor,  # [..., K]
    weight: torch.Tensor,  # [N, K]
    bias: torch.Tensor | None = None,  # [N]
) -> torch.Tensor:  # [..., N]
    """core::linear: the kernel measured fastest for the weight's shape and x's row count
    (candidates.py: the GEMV, torch's BLAS, oneDNN on a prepacked weight) for x in the
    weight's dtype and a contiguous weight; the reference for everything else."""
    rows = x.numel() // x.shape[-1] if x.dim() and x.shape[-1] else 0
    takes = (
        x.dtype is weight.dtype
        and x.dtype in DTYPES
        and weight.dim() == 2
        and weight.is_contiguous()
        and 0 < rows
        and (bias is None or (bias.dtype is x.dtype and bias.dim() == 1))
    )
    if not takes:
        return linear_reference(x, weight, bias)
    x2 = x.reshape(rows, x.shape[-1]).contiguous()
    kernel = KERNEL_CHOICES.kernel(candidates.linear_problem(weight), rows, (x2, weight, bias))
    return kernel(x2, weight, bias).view(*x.shape[:-1], weight.shape[0])


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:  # [T, 2I] -> [T, I]
    """One pass over 2-D x with a contiguous last dimension (rows may be strided)."""
    if x.dtype in DTYPES and x.dim() == 2 and x.stride(-1) == 1 and x.shape[-1] % 2 == 0:
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


def quant_linear(
    x: torch.Tensor,  # [T, K]
    qweight: torch.Tensor,
    scales: torch.Tensor,
    mins: torch.Tensor,
    bits: int,
) -> torch.Tensor:  # [T, N], x's dtype
    """core::quant_linear: the kernel measured fastest for the weight's shape, x's dtype
    and row count (candidates.py: the packed weight's GEMV and GEMMs, bf16 strips, or a
    dequantized copy through torch or oneDNN).

    A strided x is copied once (the kernels read rows of K contiguous values); a malformed
    layout (shapes that are not one packed weight) raises RuntimeError from the kernel.
    """
    takes_weight = takes_packed_weight(qweight, scales, mins, bits)
    if not (takes_weight and x.dtype in DTYPES and x.dim() == 2 and x.shape[0] > 0):
        return quant_linear_reference(x, qweight, scales, mins, bits)
    x = x.contiguous()
    args = (x, qweight, scales, mins, bits)
    problem = candidates.quant_linear_problem(x, qweight, bits)
    return KERNEL_CHOICES.kernel(problem, x.shape[0], args)(*args)


def takes_packed_weight(
    qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, bits: int
) -> bool:
    """Whether the C++ kernels take a packed weight as it lies (else the reference serves
    it): the bits' qweight dtype and float32 scales and mins, all contiguous."""
    return (
        qweight.dtype is _QWEIGHT_DTYPES.get(bits)
        and scales.dtype is torch.float32
        and mins.dtype is torch.float32
        and qweight.is_contiguous()
        and scales.is_contiguous()
        and mins.is_contiguous()
    )


def fp8_linear(
    x: torch.Tensor,  # [T, K]
    weight: torch.Tensor,  # float8_e4m3fn [N, K]
    scales: torch.Tensor,  # float32 [N, ceil(K / block_k)]
    block_k: int,
) -> torch.Tensor:  # [T, N], x's dtype
    """core::fp8_linear: the kernel measured fastest for the weight's shape, x's dtype and
    row count (candidates.py: the C++ kernels on the 1-byte weight, or a copy of W
    dequantized once through torch or oneDNN) for float32, bfloat16 or float16 x with a
    contiguous weight and scales; the reference for everything else.

    A strided x is copied once; scales that do not fit the weight raise RuntimeError from
    the kernel.
    """
    takes = (
        x.dtype in DTYPES
        and x.dim() == 2
        and x.shape[0] > 0
        and weight.dtype is _FP8_WEIGHT_DTYPE
        and scales.dtype is torch.float32
        and weight.is_contiguous()
        and scales.is_contiguous()
    )
    if not takes:
        return fp8_linear_reference(x, weight, scales, block_k)
    x = x.contiguous()
    args = (x, weight, scales, block_k)
    problem = candidates.fp8_linear_problem(x, weight)
    return KERNEL_CHOICES.kernel(problem, x.shape[0], args)(*args)


def fused_moe(
    hidden: torch.Tensor,  # [T, H]
    w13: torch.Tensor,  # [E, 2 * I, H]
    w2: torch.Tensor,  # [E, H, I]
    topk_weights: torch.Tensor,  # [T, K]
    topk_ids: torch.Tensor,  # [T, K]
) -> torch.Tensor:  # [T, H]
    """core::fused_moe: the kernel measured fastest for the experts' shape, the dtype and
    the token count (candidates.py: the reference's matmuls per expert, or the C++ grouped
    GEMVs) for float32 or bfloat16 hidden with contiguous weights of its dtype; the
    reference for everything else. Sizes that do not fit one another raise from the kernel
    chosen, naming the argument (ValueError from the reference, RuntimeError from C++)."""
    takes = (
        hidden.dtype in _MOE_DTYPES
        and w13.dtype is w2.dtype is hidden.dtype
        and w13.is_contiguous()
        and w2.is_contiguous()
        and hidden.dim() == 2
        and hidden.shape[0] > 0
        and w13.dim() == 3
        and topk_ids.dim() == 2
    )
    if not takes:
        return fused_moe_reference(hidden, w13, w2, topk_weights, topk_ids)
    args = (hidden, w13, w2, topk_weights, topk_ids)
    problem = candidates.fused_moe_problem(hidden, w13, topk_ids)
    return KERNEL_CHOICES.kernel(problem, hidden.shape[0], args)(*args)


def register() -> None:
    """Serve core's kernel ops on "cpu" with this package's kernels (re-entrant)."""
    register_impl("rms_norm", "cpu", rms_norm, PROVIDER)
    register_impl("fused_add_rms_norm", "cpu", fused_add_rms_norm, PROVIDER)
    register_impl("linear", "cpu", linear, PROVIDER)
    register_impl("silu_and_mul", "cpu", silu_and_mul, PROVIDER)
    register_impl("rotary_embedding", "cpu", rotary_embedding, PROVIDER)
    register_impl("quant_linear", "cpu", quant_linear, PROVIDER)
    register_impl("fp8_linear", "cpu", fp8_linear, PROVIDER)
    register_impl("fused_moe", "cpu", fused_moe, PROVIDER)
    # Imported here: the stack runs this module's kernels and imports it.
    from core.models.layer_stack import register_stack_builder
    from core_cpu_kernels import layer_stack

    register_stack_builder(PROVIDER, layer_stack.build)
    candidates.register()


def _takes(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the C++ kernel takes x and weight (else the reference serves them).

    It takes float32, bfloat16 or float16 x with a weight [hidden] of the same dtype, x's
    last dimension contiguous; its rows may be strided (a head-split view of a fused QKV).
    """
    if x.dtype not in DTYPES or weight.dtype is not x.dtype or x.dim() == 0:
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
    dtype of `DTYPES`, [T, heads, D] with a contiguous last dimension; contiguous int64
    positions [T]; contiguous float32 tables [positions, D / 2] of equal shape."""
    heads = query.dtype in DTYPES and key.dtype is query.dtype and query.dim() == key.dim() == 3
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
