"""Rotary position embedding (the "rotate half" / GPT-NeoX layout of HF Llama).

The cos/sin tables are computed once, in float32, for every position up to
`max_position_embeddings`, and indexed by each token's position: tokens of different
requests packed back to back each carry their own position. Queries and keys are rotated
in place by `core::rotary_embedding` (core.ops.rotary: the arithmetic of transformers).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from core.ops import rotary_embedding

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


class RotaryEmbedding(nn.Module):
    """Per-position cos/sin of the rotary frequencies.

    Positions must be below `max_position_embeddings` (the engine caps the model length
    there). The tables are float32 buffers: move the module with `.to(device)`, never
    cast it to a lower precision.
    """

    def __init__(
        self,
        head_dim: int,
        max_position_embeddings: int,
        rope_theta: float,
        rope_scaling: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        inv_freq = rope_inv_freq(head_dim, rope_theta, rope_scaling)  # [head_dim / 2]
        positions = torch.arange(max_position_embeddings, dtype=torch.float32)
        freqs = torch.outer(positions, inv_freq)  # [max_positions, head_dim / 2]
        self.register_buffer("cos_cache", freqs.cos(), persistent=False)
        self.register_buffer("sin_cache", freqs.sin(), persistent=False)

    def forward(
        self,
        positions: torch.Tensor,  # [T] int64
        query: torch.Tensor,  # [T, num_heads, head_dim], may be a view into a fused QKV
        key: torch.Tensor,  # [T, num_kv_heads, head_dim]
    ) -> None:
        """Rotate `query` and `key` in place by the angles of their tokens' positions."""
        rotary_embedding(positions, query, key, self.cos_cache, self.sin_cache)


def rope_inv_freq(
    head_dim: int, rope_theta: float, rope_scaling: dict[str, Any] | None
) -> torch.Tensor:  # [head_dim / 2] float32
    """The rotary inverse frequencies, scaled as `rope_scaling` says.

    Raises ValueError naming an unsupported rope type or a missing scaling parameter.
    """
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (rope_theta**exponents)
    rope_type = "default" if rope_scaling is None else rope_scaling.get("rope_type", "default")
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / float(_scaling_param(rope_scaling, "factor"))
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, rope_scaling)
    raise ValueError(
        f"rope_scaling type {rope_type!r} is not supported (supported: {SUPPORTED_ROPE_TYPES})"
    )


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1's frequency-dependent scaling.

    With a = original context, wavelengths w = 2*pi/f: frequencies whose wavelength is
    shorter than a/high_freq_factor keep f; longer than a/low_freq_factor become
    f/factor; in between they are interpolated linearly in a/w, so the model keeps its
    short-range resolution while long wavelengths stretch to the larger context.
    """
    factor = float(_scaling_param(scaling, "factor"))
    low = float(_scaling_param(scaling, "low_freq_factor"))
    high = float(_scaling_param(scaling, "high_freq_factor"))
    context = float(_scaling_param(scaling, "original_max_position_embeddings"))
    wavelen = 2 * math.pi / inv_freq
    # smooth is 1 for short wavelengths and 0 for long ones: the clamp gives both ends
    # exactly (f and f / factor), the interpolation the middle.
    smooth = ((context / wavelen - low) / (high - low)).clamp(0.0, 1.0)
    return (1 - smooth) * inv_freq / factor + smooth * inv_freq


def _scaling_param(scaling: dict[str, Any], key: str) -> Any:
    if scaling.get(key) is None:
        raise ValueError(f"rope_scaling of type {scaling['rope_type']!r} is missing {key!r}")
    return scaling[key]
