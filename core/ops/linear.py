"""The dense linear kernel op: y = x W^T + b, the matmul of every unquantized layer.

The reference is torch's: `F.linear`, except for a single 16-bit row on the CPU, which
goes through `torch.mv` (the same product; torch's 16-bit matmul of one row takes a slow
path, its matrix-vector product is 1.5-4x faster on SmolLM2's shapes with 2 threads).
A device kernel must equal it to its dtype's precision: float32 products summed in
float32 (in any order), 16-bit results rounded once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from core.ops.registry import CORE_OPS

_MV_DTYPES = (torch.bfloat16, torch.float16)


def linear_reference(
    x: torch.Tensor,  # [..., K]
    weight: torch.Tensor,  # [N, K]
    bias: torch.Tensor | None = None,  # [N]
) -> torch.Tensor:  # [..., N]
    """x @ weight.T + bias."""
    # The row count last: a compiled float32 forward then has no size-1 branch to trace.
    if x.dtype in _MV_DTYPES and x.device.type == "cpu" and x.dim() == 2 and x.shape[0] == 1:
        out = torch.mv(weight, x[0])
        return (out if bias is None else out + bias)[None]
    return F.linear(x, weight, bias)


def _linear_fake(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


LINEAR = CORE_OPS.declare(
    "linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor", linear_reference, _linear_fake
)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`core::linear` through the kernel serving x's device type (see LINEAR)."""
    return LINEAR(x, weight, bias)
