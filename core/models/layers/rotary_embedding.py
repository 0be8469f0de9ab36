"""Rotary position embedding (the "rotate half" / GPT-NeoX layout of HF Llama), with the
`rope_scaling` types checkpoints carry.

The cos/sin tables are computed once, in float32, for every position up to
`max_position_embeddings`, and indexed by each token's position: tokens of different
requests packed back to back each carry their own position. Queries and keys are rotated
in place by `core::rotary_embedding` (core.ops.rotary: the arithmetic of transformers).

The scaling types are transformers' (`ROPE_INIT_FUNCTIONS`), named by "rope_type" or the
legacy "type" key:
- linear: every frequency divided by `factor`.
- dynamic (NTK-aware): transformers rescales the base to each sequence's length once it
  passes `max_position_embeddings`; a table indexed by position cannot follow a length,
  so, as vLLM does, the base is scaled once, for a length of max_position_embeddings *
  factor (transformers' frequencies at that length).
- yarn: high frequencies kept, low ones divided by `factor`, a linear ramp between
  (`beta_fast` / `beta_slow` rotations within `original_max_position_embeddings`), and cos
  and sin multiplied by the attention factor (`rope_attention_factor`). DeepSeek's configs
  also scale the softmax (`yarn_softmax_scale_factor`).
- llama3: Llama 3.1's frequency bands.
- longrope (Phi-3; "su" in its first configs): frequencies divided by per-frequency
  `short_factor`s for positions within `original_max_position_embeddings`, by
  `long_factor`s past it, and cos and sin multiplied by the attention factor.
  transformers picks one set for a whole forward pass by its last position: a sequence
  recomputed from scratch past the window gets the long factors at every position. Its
  generation with a KV cache, though, keeps every key as first computed, so a prompt
  inside the window keeps its short-factor keys and only the positions past the window
  get the long factors: a choice by position. The KV cache, the prefix cache and the
  recomputation of a preempted request here keep keys the same way, so the table
  chooses by position (as vLLM's cache does): the tokens equal transformers' cached
  greedy generation for every prompt inside the original window; a longer prompt
  differs (transformers prefills it with the long factors throughout).

M-RoPE (Qwen2-VL's multimodal rotary; `mrope_section` in the scaling dict, any type) gives
each token three positions, time, height and width ([3, T]): the rotary frequencies split
into three consecutive sections of `mrope_section` frequencies, each section turned by
its own stream's position. Text tokens carry equal streams, which is plain RoPE, so a
[T] position vector is still taken.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from core.ops import rotary_embedding

SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3", "longrope")
_ROPE_TYPE_ALIASES = {"su": "longrope"}  # Phi-3's first configs


class RotaryEmbedding(nn.Module):
    """Per-position cos/sin of the rotary frequencies.

    Positions must be below `max_position_embeddings` (the engine caps the model length
    there). The tables are float32 buffers: move the module with `.to(device)`, never
    cast it to a lower precision. With `rotary_dim` below `head_dim` (partial rotary, as
    transformers' `partial_rotary_factor`) only the first `rotary_dim` dimensions of each
    head rotate, pairing i with i + rotary_dim / 2; the rest pass unchanged. With an
    `mrope_section` in `rope_scaling`, positions may also be M-RoPE's [3, T].
    """

    def __init__(
        self,
        head_dim: int,
        max_position_embeddings: int,
        rope_theta: float,
        rope_scaling: dict[str, Any] | None = None,
        rotary_dim: int | None = None,  # default: head_dim
    ) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.rotary_dim = head_dim if rotary_dim is None else rotary_dim
        if not 0 < self.rotary_dim <= head_dim or self.rotary_dim % 2:
            raise ValueError(
                f"rotary dimension {self.rotary_dim} should be even and in 2..{head_dim} "
                "(the head size)"
            )
        cos, sin = rope_cos_sin(self.rotary_dim, max_position_embeddings, rope_theta, rope_scaling)
        self.register_buffer("cos_cache", cos, persistent=False)  # [max_positions, rotary_dim / 2]
        self.register_buffer("sin_cache", sin, persistent=False)
        section = (rope_scaling or {}).get("mrope_section")
        # M-RoPE: [rotary_dim / 2], the stream (0 time, 1 height, 2 width) of each frequency.
        streams = None if section is None else _mrope_streams(section, self.rotary_dim // 2)
        self.register_buffer("mrope_streams", streams, persistent=False)

    def lean(self) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]:
        return self.forward  # core.models.lean_step

    def forward(
        self,
        positions: torch.Tensor,  # [T] int64, or M-RoPE's [3, T]
        query: torch.Tensor,  # [T, num_heads, head_dim], may be a view into a fused QKV
        key: torch.Tensor,  # [T, num_kv_heads, head_dim]
    ) -> None:
        """Rotate `query` and `key` in place by the angles of their tokens' positions."""
        if self.rotary_dim < self.head_dim:
            # Views of the rotated dimensions: [T, heads, rotary_dim], heads head_dim apart.
            query, key = query[..., : self.rotary_dim], key[..., : self.rotary_dim]
        if positions.dim() == 1:
            rotary_embedding(positions, query, key, self.cos_cache, self.sin_cache)
            return
        # M-RoPE: each token's own angles, one row per token, so the op indexes them by
        # token (0..T-1) rather than by position.
        cos, sin = self._mrope_tables(positions)
        rows = torch.arange(positions.shape[1], device=positions.device)
        rotary_embedding(rows, query, key, cos, sin)

    def _mrope_tables(
        self,
        positions: torch.Tensor,  # [3, T] int64
    ) -> tuple[torch.Tensor, torch.Tensor]:  # cos, sin: [T, rotary_dim / 2]
        if self.mrope_streams is None:
            raise ValueError("positions of shape [3, T] need an mrope_section in rope_scaling")
        index = self.mrope_streams.expand(1, positions.shape[1], -1)  # [1, T, rotary_dim / 2]
        cos = self.cos_cache[positions].gather(0, index)[0]  # [3, T, r / 2] -> [T, r / 2]
        sin = self.sin_cache[positions].gather(0, index)[0]
        return cos, sin


def _mrope_streams(section: list[int], num_freqs: int) -> torch.Tensor:  # [num_freqs] int64
    """The M-RoPE stream of each rotary frequency: `section[i]` consecutive ones per stream."""
    if len(section) != 3 or sum(section) != num_freqs:
        raise ValueError(
            f"rope_scaling 'mrope_section' {list(section)} should be 3 sizes summing to "
            f"{num_freqs} (half the rotary dimensions)"
        )
    return torch.repeat_interleave(torch.arange(3), torch.tensor(section))


def rope_cos_sin(
    rotary_dim: int,
    max_position_embeddings: int,
    rope_theta: float,
    rope_scaling: dict[str, Any] | None,
) -> tuple[torch.Tensor, torch.Tensor]:  # cos, sin: [max_position_embeddings, rotary_dim / 2]
    """float32 cos and sin of every position's rotary angles, scaled as `rope_scaling`
    says and multiplied by its `rope_attention_factor` (where transformers multiplies its
    cos and sin).

    `max_position_embeddings` is the config's: dynamic NTK, YaRN and LongRoPE read it.
    Raises ValueError naming an unsupported rope type or a missing or invalid parameter.
    """
    positions = torch.arange(max_position_embeddings, dtype=torch.float32)
    if _rope_type(rope_scaling) == "longrope":
        short, long = _longrope_inv_freqs(rotary_dim, rope_theta, rope_scaling)
        original = int(_scaling_param(rope_scaling, "original_max_position_embeddings"))
        angles = torch.cat(
            (torch.outer(positions[:original], short), torch.outer(positions[original:], long))
        )
    else:
        inv_freq = _inv_freq(rotary_dim, rope_theta, rope_scaling, max_position_embeddings)
        angles = torch.outer(positions, inv_freq)  # [max_positions, rotary_dim / 2]
    factor = rope_attention_factor(rope_scaling, max_position_embeddings)
    return angles.cos() * factor, angles.sin() * factor


def rope_attention_factor(
    rope_scaling: dict[str, Any] | None, max_position_embeddings: int
) -> float:
    """The factor cos and sin are multiplied by (transformers' `attention_scaling`), so
    every query-key product of the rotated dimensions is multiplied by its square.

    YaRN and LongRoPE: the config's `attention_factor`, else the type's default from the
    context factor (`factor`, else max_position_embeddings over the original context):
    YaRN's yarn_mscale(factor), or with DeepSeek's `mscale` and `mscale_all_dim`
    yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim); LongRoPE's
    sqrt(1 + log(factor) / log(original context)), 1 when factor <= 1. Other types: 1.
    """
    rope_type = _rope_type(rope_scaling)
    if rope_type not in ("yarn", "longrope"):
        return 1.0
    if rope_scaling.get("attention_factor") is not None:
        return float(rope_scaling["attention_factor"])
    factor = _context_factor(rope_scaling, max_position_embeddings)
    if rope_type == "longrope":
        original = float(_scaling_param(rope_scaling, "original_max_position_embeddings"))
        return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    mscale, mscale_all_dim = rope_scaling.get("mscale"), rope_scaling.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return yarn_mscale(factor, float(mscale)) / yarn_mscale(factor, float(mscale_all_dim))
    return yarn_mscale(factor)


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction for a context stretched `factor` times (its Eq. 21):
    0.1 * mscale * ln(factor) + 1, and 1 when nothing is stretched."""
    return 1.0 if factor <= 1.0 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_softmax_scale_factor(rope_scaling: dict[str, Any] | None) -> float:
    """What DeepSeek-V2/V3 multiply the attention's softmax scale by: yarn_mscale(factor,
    mscale_all_dim) squared when the scaling has an `mscale_all_dim`, else 1.

    Their reference implementation scales every query-key product, rotary dimensions or
    not, this way (transformers' `yarn_apply_mscale`); the rotary dimensions' own
    correction is in the cos/sin tables (`rope_attention_factor`).
    """
    if _rope_type(rope_scaling) == "default" or not rope_scaling.get("mscale_all_dim"):
        return 1.0
    factor = float(_scaling_param(rope_scaling, "factor"))
    return yarn_mscale(factor, float(rope_scaling["mscale_all_dim"])) ** 2


def _rope_type(rope_scaling: dict[str, Any] | None) -> str:
    """The scaling's type ("rope_type", or the legacy "type"); ValueError if unsupported."""
    if rope_scaling is None:
        return "default"
    rope_type = rope_scaling.get("rope_type") or rope_scaling.get("type") or "default"
    rope_type = _ROPE_TYPE_ALIASES.get(rope_type, rope_type)
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"rope_scaling type {rope_type!r} is not supported (supported: {SUPPORTED_ROPE_TYPES})"
        )
    return rope_type


def _inv_freq(
    rotary_dim: int,
    rope_theta: float,
    rope_scaling: dict[str, Any] | None,
    max_position_embeddings: int,
) -> torch.Tensor:  # [rotary_dim / 2] float32
    """The inverse frequencies of every position, for the types that have one set."""
    rope_type = _rope_type(rope_scaling)
    if rope_type == "linear":
        factor = float(_scaling_param(rope_scaling, "factor"))
        return _base_inv_freq(rotary_dim, rope_theta) / factor
    if rope_type == "dynamic":
        return _base_inv_freq(rotary_dim, _dynamic_ntk_theta(rotary_dim, rope_theta, rope_scaling))
    if rope_type == "yarn":
        return _yarn_inv_freq(rotary_dim, rope_theta, rope_scaling, max_position_embeddings)
    if rope_type == "llama3":
        return _llama3_inv_freq(_base_inv_freq(rotary_dim, rope_theta), rope_scaling)
    return _base_inv_freq(rotary_dim, rope_theta)


def _base_inv_freq(rotary_dim: int, rope_theta: float) -> torch.Tensor:  # [rotary_dim / 2]
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    return 1.0 / (rope_theta**exponents)


def _dynamic_ntk_theta(rotary_dim: int, rope_theta: float, scaling: dict[str, Any]) -> float:
    """transformers' NTK-aware base for a sequence of max_position_embeddings * factor:
    theta * (factor * length / max_position_embeddings - (factor - 1)) ** (d / (d - 2)),
    where length / max_position_embeddings is the factor itself."""
    factor = float(_scaling_param(scaling, "factor"))
    return rope_theta * (factor * factor - (factor - 1)) ** (rotary_dim / (rotary_dim - 2))


def _yarn_inv_freq(
    rotary_dim: int, rope_theta: float, scaling: dict[str, Any], max_position_embeddings: int
) -> torch.Tensor:
    """YaRN's blend of the kept (extrapolated) and divided (interpolated) frequencies.

    Frequencies that turn more than `beta_fast` times within the original context keep
    their value (the model saw every phase of them); those turning fewer than `beta_slow`
    times are divided by the factor; a linear ramp over the dimensions in between.
    """
    factor = _context_factor(scaling, max_position_embeddings)
    original = float(_scaling_param(scaling, "original_max_position_embeddings"))
    pos_freqs = rope_theta ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    low, high = (
        _yarn_correction_dim(float(scaling.get(key) or default), rotary_dim, rope_theta, original)
        for key, default in (("beta_fast", 32), ("beta_slow", 1))
    )
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    span = high - low if high != low else 0.001  # transformers' guard against a zero ramp
    ramp = ((torch.arange(rotary_dim // 2, dtype=torch.float32) - low) / span).clamp(0, 1)
    keep = 1 - ramp  # 1: extrapolate (keep the frequency), 0: interpolate
    return interpolation * (1 - keep) + extrapolation * keep


def _yarn_correction_dim(
    rotations: float, rotary_dim: int, rope_theta: float, context: float
) -> float:
    """The (fractional) dimension whose frequency turns `rotations` times in `context`."""
    return rotary_dim * math.log(context / (rotations * 2 * math.pi)) / (2 * math.log(rope_theta))


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


def _longrope_inv_freqs(
    rotary_dim: int, rope_theta: float, scaling: dict[str, Any]
) -> tuple[torch.Tensor, torch.Tensor]:  # short, long: [rotary_dim / 2] each
    """The base frequencies divided by the short and by the long per-frequency factors."""
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    base = rope_theta**exponents
    short, long = (
        1.0 / (_per_frequency(scaling, key, rotary_dim // 2) * base)
        for key in ("short_factor", "long_factor")
    )
    return short, long


def _per_frequency(scaling: dict[str, Any], key: str, num_freqs: int) -> torch.Tensor:
    values = _scaling_param(scaling, key)
    if len(values) != num_freqs:
        raise ValueError(
            f"rope_scaling {key!r} has {len(values)} values; the rotary dimensions need "
            f"{num_freqs} (one per frequency)"
        )
    return torch.tensor(values, dtype=torch.float32)


def _context_factor(scaling: dict[str, Any], max_position_embeddings: int) -> float:
    """How many times the original context is stretched: `factor`, else (Phi-3,
    DeepSeek-V3) max_position_embeddings over original_max_position_embeddings."""
    if scaling.get("factor") is not None:
        return float(scaling["factor"])
    original = float(_scaling_param(scaling, "original_max_position_embeddings"))
    return max_position_embeddings / original


def _scaling_param(scaling: dict[str, Any], key: str) -> Any:
    if scaling.get(key) is None:
        raise ValueError(f"rope_scaling of type {_rope_type(scaling)!r} is missing {key!r}")
    return scaling[key]
