"""The gated activation of the Llama-family MLP."""

from __future__ import annotations

import torch
from torch import nn

from core.ops import silu_and_mul


class SiluAndMul(nn.Module):
    """silu(gate) * up, where the input is [gate | up] concatenated on the last dimension
    (`core::silu_and_mul`: the kernel serving x's device type, `core info` names it)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [T, 2 * I] -> [T, I]
        return silu_and_mul(x)
