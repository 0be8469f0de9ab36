"""RMSNorm kernel ops, with the numerics of Hugging Face's LlamaRMSNorm as the reference.

The statistics and the scaling are computed in float32 and the result is cast back to the
input dtype *before* the weight multiply, so a bfloat16 model rounds exactly where
transformers does; the output dtype is the promotion of the weight's and the input's.
"""

from __future__ import annotations

import torch

from core import batch_invariant
from core.ops.registry import CORE_OPS
from core.ops.samples import Conformance, OpSample, Tolerance, randn

_EPS = 1e-6  # the samples' epsilon: SmolLM2's, small enough that it never dominates

# A kernel may round the float32 sum of squares differently (another summation order),
# which moves the normalized row, rounded to a half type, by one unit in the last place,
# and the product with the weight by one more.
TOLERANCES = {
    torch.float32: Tolerance(rtol=1e-5, atol=1e-6),
    torch.bfloat16: Tolerance(rtol=2 * torch.finfo(torch.bfloat16).eps, atol=1e-5),
    torch.float16: Tolerance(rtol=2 * torch.finfo(torch.float16).eps, atol=1e-5),
}


def rms_norm_reference(
    x: torch.Tensor,  # [..., hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
) -> torch.Tensor:  # [..., hidden]
    """weight * (x / sqrt(mean(x^2) + eps)) over the last dimension (row by row in
    batch-invariant mode)."""
    if batch_invariant.enabled():
        return batch_invariant.rowwise(_rms_norm, (x,), weight, eps)
    return _rms_norm(x, weight, eps)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    variance = x32.pow(2).mean(-1, keepdim=True)  # [..., 1]
    return weight * (x32 * torch.rsqrt(variance + eps)).to(x.dtype)


def fused_add_rms_norm_reference(
    x: torch.Tensor,  # [..., hidden]
    residual: torch.Tensor,  # [..., hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # (normed, new_residual), both [..., hidden]
    """The residual add of a decoder layer and the next norm: (rms_norm(x + r), x + r).

    The sum is rounded to its dtype before it is normalized, as the unfused layer does.
    """
    new_residual = x + residual
    return rms_norm_reference(new_residual, weight, eps), new_residual


def _rms_norm_fake(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    shape = torch.broadcast_shapes(x.shape, weight.shape)
    return x.new_empty(shape, dtype=torch.promote_types(weight.dtype, x.dtype))


def _fused_add_rms_norm_fake(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    sum_shape = torch.broadcast_shapes(x.shape, residual.shape)
    sum_dtype = torch.promote_types(x.dtype, residual.dtype)
    new_residual = x.new_empty(sum_shape, dtype=sum_dtype)
    return _rms_norm_fake(new_residual, weight, eps), new_residual


def _rms_norm_samples(dtype: torch.dtype, device: torch.device) -> list[OpSample]:
    def sample(name: str, x: torch.Tensor) -> OpSample:
        return OpSample(name, (x, randn(x.shape[-1:], dtype, device, seed=1), _EPS))

    qkv = randn((5, 3 * 4 * 16), dtype, device, seed=0, scale=3)  # [T, (H + 2 H_kv) * D]
    return [
        sample("one row", randn((1, 64), dtype, device, seed=0, scale=3)),
        sample("odd hidden size", randn((5, 7), dtype, device, seed=0, scale=3)),
        sample("hidden size 1", randn((3, 1), dtype, device, seed=0, scale=3)),
        sample("3-D input", randn((2, 3, 40), dtype, device, seed=0, scale=3)),
        sample("head-split view of a fused QKV", qkv[:, : 4 * 16].view(5, 4, 16)),
    ]


def _fused_add_rms_norm_samples(dtype: torch.dtype, device: torch.device) -> list[OpSample]:
    def sample(name: str, x: torch.Tensor, residual: torch.Tensor) -> OpSample:
        weight = randn(x.shape[-1:], dtype, device, seed=1)
        return OpSample(name, (x, residual, weight, _EPS))

    def pair(shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        return randn(shape, dtype, device, seed=0, scale=3), randn(shape, dtype, device, seed=2)

    x_rows, residual_rows = randn((6, 40), dtype, device, seed=0), randn((6, 40), dtype, device, 2)
    return [
        sample("one row", *pair((1, 64))),
        sample("odd hidden size", *pair((5, 7))),
        sample("3-D input", *pair((2, 3, 40))),
        sample("strided rows of both inputs", x_rows[::2, :24], residual_rows[::2, :24]),
    ]


RMS_NORM = CORE_OPS.declare(
    "rms_norm(Tensor x, Tensor weight, float eps) -> Tensor",
    rms_norm_reference,
    _rms_norm_fake,
    Conformance(_rms_norm_samples, TOLERANCES),
)
FUSED_ADD_RMS_NORM = CORE_OPS.declare(
    "fused_add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)",
    fused_add_rms_norm_reference,
    _fused_add_rms_norm_fake,
    Conformance(_fused_add_rms_norm_samples, TOLERANCES),
)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`core::rms_norm` through the kernel serving x's device type (see RMS_NORM)."""
    return RMS_NORM(x, weight, eps)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """`core::fused_add_rms_norm` through the kernel serving x's device type."""
    return FUSED_ADD_RMS_NORM(x, residual, weight, eps)
