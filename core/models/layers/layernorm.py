"""RMSNorm with the numerics of Hugging Face's LlamaRMSNorm."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight over the last dimension.

    As transformers computes it: the statistics and the scaling in float32, the result
    cast back to the input dtype *before* the weight multiply, so a bfloat16 model rounds
    exactly where the reference does.
    """

    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., hidden_size]
        x32 = x.float()
        variance = x32.pow(2).mean(-1, keepdim=True)  # [..., 1]
        return self.weight * (x32 * torch.rsqrt(variance + self.eps)).to(x.dtype)
