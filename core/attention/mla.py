"""The layer models use for multi-head latent attention (MLA, DeepSeek-V2).

An `MLAAttention` caches one latent per token ([kv_lora_rank | qk_rope_head_dim], sized
by `MLADims`) where `Attention` caches every KV head's key and value: the worker sizes
its pages from an `MLAAttentionSpec` and selects an MLA backend for it (the requirement's
`use_mla`; a backend family names its MLA variant, `AttentionBackend.mla_backend`). The
backend's impl gets the layer's `kv_b_proj`, which expands latents into every head's key
and value, so it may attend either over expanded keys or, weights absorbed, over the
latents themselves (core.attention.backends.mla_ref).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from core.attention.interface import AttentionBackend, MLADims
from core.attention.layer import Attention
from core.kv_cache.spec import MLAAttentionSpec

__all__ = ["MLAAttention"]


class MLAAttention(Attention):
    """Attention of `num_heads` heads over one cached latent of `dims.latent_size` per
    token: `head_size` is the latent's size and `num_kv_heads` 1 (what the cache holds)."""

    use_mla = True

    def __init__(
        self, layer_name: str, num_heads: int, scale: float, dims: MLADims, kv_b_proj: nn.Module
    ) -> None:
        super().__init__(layer_name, num_heads, dims.latent_size, scale, num_kv_heads=1)
        self.dims = dims
        # Also the model's own submodule, registered there first, so that its parameter
        # keeps the model's name (named_parameters yields a shared one once).
        self.kv_b_proj = kv_b_proj

    def impl_keywords(self, backend: type[AttentionBackend]) -> dict[str, Any]:
        """The MLA impl's `mla` and `kv_b_proj`; ValueError when `backend` is not an MLA
        backend (the selector picks a family's `mla_backend` for MLA requirements)."""
        if not backend.capabilities.mla:
            raise ValueError(
                f"{self.layer_name}: attention backend {backend.name!r} cannot serve "
                "multi-head latent attention (MLA)"
            )
        return {"mla": self.dims, "kv_b_proj": self.kv_b_proj}

    def kv_cache_spec(self, block_size: int, dtype: torch.dtype) -> MLAAttentionSpec:
        """One latent of `head_size` per token, no separate value."""
        return MLAAttentionSpec(block_size=block_size, head_size=self.head_size, dtype=dtype)

    def forward(  # type: ignore[override]
        self,
        query: torch.Tensor,  # [T, H * (Dn + Dr)], the rotary part rotated
        latent: torch.Tensor,  # [T, L]: normalized compressed KV, then the rotated key
    ) -> torch.Tensor:  # [T, H * Dv]
        value = latent[:, : self.dims.kv_lora_rank]  # the latent is its own value
        return super().forward(query, latent, value)

    @property
    def output_size(self) -> int:
        return self.num_heads * self.dims.v_head_dim

    def split_heads(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """query [T, H, Dn + Dr]; the latents [T, 1, L] and their values [T, 1, R]."""
        num_tokens = query.shape[0]
        return (
            query.view(num_tokens, self.num_heads, -1),
            key.view(num_tokens, 1, -1),
            value.view(num_tokens, 1, -1),
        )
