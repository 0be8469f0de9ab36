"""RMSNorm kernel ops, with the numerics of Hugging Face's LlamaRMSNorm as the reference.

The statistics and the scaling are computed in float32 and the result is cast back to the
input dtype *before* the weight multiply, so a bfloat16 model rounds exactly where
transformers does; the output dtype is the promotion of the weight's and the input's.
"""

from __future__ import annotations

import torch

from core.ops.registry import CORE_OPS


def rms_norm_reference(
    x: torch.Tensor,  # [..., hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
) -> torch.Tensor:  # [..., hidden]
    """weight * (x / sqrt(mean(x^2) + eps)) over the last dimension."""
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


RMS_NORM = CORE_OPS.declare(
    "rms_norm(Tensor x, Tensor weight, float eps) -> Tensor",
    rms_norm_reference,
    _rms_norm_fake,
)
FUSED_ADD_RMS_NORM = CORE_OPS.declare(
    "fused_add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)",
    fused_add_rms_norm_reference,
    _fused_add_rms_norm_fake,
)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`core::rms_norm` through the kernel serving x's device type (see RMS_NORM)."""
    return RMS_NORM(x, weight, eps)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """`core::fused_add_rms_norm` through the kernel serving x's device type."""
    return FUSED_ADD_RMS_NORM(x, residual, weight, eps)
