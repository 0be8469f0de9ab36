"""The gated activation of the Llama-family MLP as a kernel op: silu(gate) * up.

The reference is torch's `F.silu(gate) * up`, so a half-precision model rounds the SiLU
before the product, as transformers does. A kernel may compute silu(gate) * up in float32
and round once: that differs from the reference (two roundings against one) by one unit
in the last place of the output dtype, two where the values straddle a power of two; the
tolerances below allow that.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from core.ops.registry import CORE_OPS
from core.ops.samples import Conformance, OpSample, Tolerance, randn

TOLERANCES = {
    torch.float32: Tolerance(rtol=1e-5, atol=1e-6),
    torch.bfloat16: Tolerance(rtol=2 * torch.finfo(torch.bfloat16).eps, atol=1e-5),
    torch.float16: Tolerance(rtol=2 * torch.finfo(torch.float16).eps, atol=1e-5),
}


def silu_and_mul_reference(x: torch.Tensor) -> torch.Tensor:  # [..., 2 * I] -> [..., I]
    """silu(gate) * up, where x is [gate | up] concatenated on the last dimension.

    ValueError when the last dimension is odd (no equal halves).
    """
    gate, up = _halves(x)
    return F.silu(gate) * up


def _halves(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if x.dim() == 0 or x.shape[-1] % 2:
        raise ValueError(f"x of silu_and_mul must be [..., 2 * I], got {tuple(x.shape)}")
    gate, up = x.chunk(2, dim=-1)
    return gate, up


def _silu_and_mul_fake(x: torch.Tensor) -> torch.Tensor:
    gate, _ = _halves(x)
    return x.new_empty(gate.shape)


def _silu_and_mul_samples(dtype: torch.dtype, device: torch.device) -> list[OpSample]:
    def sample(name: str, shape: tuple[int, ...]) -> OpSample:
        return OpSample(name, (randn(shape, dtype, device, seed=0, scale=4),))

    rows = randn((6, 2 * 24 + 8), dtype, device, seed=0, scale=4)
    return [
        sample("one row", (1, 2 * 96)),
        sample("odd intermediate size", (5, 2 * 7)),
        sample("intermediate size 1", (3, 2)),
        sample("3-D input", (2, 3, 2 * 40)),
        OpSample("strided rows", (rows[::2, : 2 * 24],)),
    ]


SILU_AND_MUL = CORE_OPS.declare(
    "silu_and_mul(Tensor x) -> Tensor",
    silu_and_mul_reference,
    _silu_and_mul_fake,
    Conformance(_silu_and_mul_samples, TOLERANCES),
)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """`core::silu_and_mul` through the kernel serving x's device type (see SILU_AND_MUL)."""
    return SILU_AND_MUL(x)
