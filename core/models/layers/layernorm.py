"""RMSNorm with the numerics of Hugging Face's LlamaRMSNorm, through core's kernel ops, and
Gemma's variant of it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import nn

from core.ops import fused_add_rms_norm, rms_norm


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight over the last dimension (`core::rms_norm`).

    As transformers computes it: the statistics and the scaling in float32, the result
    cast back to the input dtype *before* the weight multiply, so a bfloat16 model rounds
    exactly where the reference does. The kernel is whichever serves x's device type
    (`core info` names it).
    """

    # What a new weight holds: the identity scale, in the parameterization checkpoints use.
    initial_weight: ClassVar[float] = 1.0

    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.eps = eps
        weight = torch.full((hidden_size,), self.initial_weight, dtype=dtype)
        self.weight = nn.Parameter(weight, requires_grad=False)

    def forward(
        self,
        x: torch.Tensor,  # [..., hidden_size]
        residual: torch.Tensor | None = None,  # [..., hidden_size]
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """norm(x); with a residual, (norm(x + residual), x + residual) in one pass."""
        if residual is None:
            return self._norm(x)
        return self._add_norm(x, residual)

    def lean(self) -> Callable[..., Any]:
        return self.forward  # core.models.lean_step

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)

    def _add_norm(
        self, x: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return fused_add_rms_norm(x, residual, self.weight, self.eps)


class GemmaRMSNorm(RMSNorm):
    """x / sqrt(mean(x^2) + eps) * (1 + weight): Gemma's norm, whose checkpoints store the
    offset from 1 (a zero weight is the identity scale).

    As transformers' Gemma2RMSNorm computes it: the weight multiply in float32 too, the
    result cast to the input dtype last. Plain PyTorch: no kernel op has this numerics.
    """

    initial_weight: ClassVar[float] = 0.0

    def _add_norm(
        self, x: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x = x + residual
        return self._norm(x), x

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).to(x.dtype)
