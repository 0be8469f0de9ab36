"""The gated activations of the decoders' MLPs."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from core.ops import silu_and_mul


class SiluAndMul(nn.Module):
    """silu(gate) * up, where the input is [gate | up] concatenated on the last dimension
    (`core::silu_and_mul`: the kernel serving x's device type, `core info` names it)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [T, 2 * I] -> [T, I]
        return silu_and_mul(x)

    def lean(self) -> Callable[[torch.Tensor], torch.Tensor]:
        return self.forward  # core.models.lean_step


class GeluTanhAndMul(nn.Module):
    """gelu(gate) * up with GELU's tanh approximation (`gelu_pytorch_tanh`: Gemma's MLP),
    where the input is [gate | up] concatenated on the last dimension. Plain PyTorch."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [T, 2 * I] -> [T, I]
        gate, up = x.chunk(2, dim=-1)
        return F.gelu(gate, approximate="tanh") * up
