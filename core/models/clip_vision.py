"""The CLIP-style vision transformer, as LLaVA uses it: CLIP's and SigLIP's image encoders,
read out at chosen layers.

One image is a sequence of patch embeddings (CLIP puts a class token first) plus learned
position embeddings; pre-norm encoder layers follow. LLaVA reads the hidden states of some
layers, never the pooled output: the final norm (`post_layernorm`) and SigLIP's pooling
head are not built, and neither are the layers past the last one read.
Module names are transformers' (CLIPVisionModel / SiglipVisionModel), so checkpoint
tensors load by name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from core.models.layers.vision import VisionMLP, attention_within, vision_activation

CLIP = "clip_vision_model"
SIGLIP = "siglip_vision_model"
# transformers' CLIPVisionConfig / SiglipVisionConfig defaults, for keys a config omits.
_DEFAULTS: dict[str, dict[str, Any]] = {
    CLIP: dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
               num_attention_heads=12, num_channels=3, image_size=224, patch_size=32,
               layer_norm_eps=1e-5, hidden_act="quick_gelu"),
    SIGLIP: dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                 num_attention_heads=12, num_channels=3, image_size=224, patch_size=16,
                 layer_norm_eps=1e-6, hidden_act="gelu_pytorch_tanh"),
}  # fmt: skip


@dataclass(frozen=True)
class ClipVisionConfig:
    """A CLIP or SigLIP vision config (`vision_config` of a LLaVA config.json)."""

    model_type: str  # CLIP or SIGLIP
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_channels: int
    image_size: int
    patch_size: int
    layer_norm_eps: float
    hidden_act: str

    @classmethod
    def from_hf(cls, d: dict[str, Any], model: str) -> ClipVisionConfig:
        """ValueError naming `model` when the encoder is neither CLIP's nor SigLIP's."""
        model_type = d.get("model_type")
        if model_type not in _DEFAULTS:
            raise ValueError(
                f"config 'vision_config.model_type' {model_type!r} is not supported by {model} "
                f"(one of {sorted(_DEFAULTS)})"
            )
        values = {**_DEFAULTS[model_type], **{k: d[k] for k in _DEFAULTS[model_type] if k in d}}
        return cls(model_type=model_type, **values)

    @property
    def class_token(self) -> bool:
        """Whether a class token precedes the patches (CLIP's; SigLIP has none)."""
        return self.model_type == CLIP

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2


class _Embeddings(nn.Module):
    def __init__(self, config: ClipVisionConfig, dtype: torch.dtype) -> None:
        super().__init__()
        width = config.hidden_size
        self.class_embedding = (
            nn.Parameter(torch.empty(width, dtype=dtype)) if config.class_token else None
        )
        self.patch_embedding = nn.Conv2d(
            config.num_channels, width, config.patch_size, config.patch_size,
            bias=config.model_type == SIGLIP, dtype=dtype,  # CLIP's projection has no bias
        )  # fmt: skip
        num_positions = config.num_patches + int(config.class_token)
        self.position_embedding = nn.Embedding(num_positions, width, dtype=dtype)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:  # [B, C, S, S] -> [B, N, W]
        patches = self.patch_embedding(pixel_values).flatten(2).transpose(1, 2)  # [B, P, W]
        if self.class_embedding is not None:
            cls = self.class_embedding.expand(patches.shape[0], 1, -1)  # [B, 1, W]
            patches = torch.cat((cls, patches), dim=1)
        return patches + self.position_embedding.weight


class _Attention(nn.Module):
    def __init__(self, width: int, num_heads: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (
            nn.Linear(width, width, dtype=dtype) for _ in range(4)
        )

    def forward(self, x: torch.Tensor, seq_lens: Sequence[int]) -> torch.Tensor:  # [N, W]
        q, k, v = (
            proj(x).view(x.shape[0], self.num_heads, -1)  # [N, H, D]
            for proj in (self.q_proj, self.k_proj, self.v_proj)
        )
        return self.out_proj(attention_within(q, k, v, seq_lens))


class _EncoderLayer(nn.Module):
    def __init__(self, config: ClipVisionConfig, dtype: torch.dtype) -> None:
        super().__init__()
        width, eps = config.hidden_size, config.layer_norm_eps
        act = vision_activation(config.hidden_act, "vision_config.hidden_act")
        self.layer_norm1 = nn.LayerNorm(width, eps, dtype=dtype)
        self.self_attn = _Attention(width, config.num_attention_heads, dtype)
        self.layer_norm2 = nn.LayerNorm(width, eps, dtype=dtype)
        self.mlp = VisionMLP(width, config.intermediate_size, act, dtype)

    def forward(self, x: torch.Tensor, seq_lens: Sequence[int]) -> torch.Tensor:  # [N, W]
        x = x + self.self_attn(self.layer_norm1(x), seq_lens)
        return x + self.mlp(self.layer_norm2(x))


class ClipVisionTower(nn.Module):
    """CLIP's or SigLIP's encoder, its first `num_layers` layers."""

    def __init__(self, config: ClipVisionConfig, num_layers: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.config = config
        self.embeddings = _Embeddings(config, dtype)
        width = config.hidden_size
        self.pre_layrnorm = (  # transformers' spelling
            nn.LayerNorm(width, config.layer_norm_eps, dtype=dtype)
            if config.class_token
            else nn.Identity()
        )
        layers = nn.ModuleList(_EncoderLayer(config, dtype) for _ in range(num_layers))
        self.encoder = nn.ModuleDict({"layers": layers})

    def forward(
        self,
        pixel_values: torch.Tensor,  # [B, C, image_size, image_size]
        layers: Sequence[int],  # hidden states to read: 0 the embeddings, i after layer i
    ) -> torch.Tensor:  # [B, N, W * len(layers)], N patches (+ the class token)
        size = self.config.image_size
        if tuple(pixel_values.shape[1:]) != (self.config.num_channels, size, size):
            raise ValueError(
                f"pixel_values of shape {tuple(pixel_values.shape)}: the vision encoder takes "
                f"[B, {self.config.num_channels}, {size}, {size}]"
            )
        hidden = self.pre_layrnorm(self.embeddings(pixel_values))  # [B, N, W]
        batch, num_tokens, _ = hidden.shape
        hidden = hidden.flatten(0, 1)  # the images back to back: [B * N, W]
        states = [hidden]
        for layer in self.encoder["layers"]:
            hidden = layer(hidden, [num_tokens] * batch)
            states.append(hidden)
        selected = torch.cat([states[i] for i in layers], dim=-1)  # [B * N, W * len(layers)]
        return selected.view(batch, num_tokens, -1)
