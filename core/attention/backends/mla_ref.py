"""The reference multi-head latent attention (MLA, DeepSeek-V2) backend in pure PyTorch.

An MLA layer caches one latent per token, [kv_lora_rank | qk_rope_head_dim], instead of
every head's key and value (`core.attention.interface.MLADims`). Its keys and values are
linear in the latent, so there are two exact ways to attend:

- decompress: expand the context's latents through kv_b_proj into every head's key and
  value and run ordinary attention. Prefill chunks do this: their many queries share
  the expansion, and the heads' keys are narrower than the latent.
- absorb: fold W_UK into the query (q_nope . (W_UK c) = (W_UK^T q_nope) . c) and W_UV
  into the output, so the heads attend over the cached latents themselves, as one
  key-value head of size latent_size (MQA) whose value is the latent's first
  kv_lora_rank entries. Decode rows do this: one query each would otherwise expand the
  whole context.

The step's metadata are the reference backend's (`core.attention.paged_metadata`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from core.attention.interface import (
    AttentionBackend,
    AttentionCapabilities,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
    MLADims,
)
from core.attention.paged_metadata import (
    DecodeBatch,
    PagedAttentionMetadata,
    PagedAttentionMetadataBuilder,
    PrefillChunk,
)

__all__ = ["TorchRefMLABackend", "TorchRefMLAImpl"]


class TorchRefMLAImpl(AttentionImpl):
    """The reference MLA kernel (the forward contract is written on `MLADims`).

    KV layout (`TorchRefMLABackend.get_kv_cache_shape`): `kv_cache` is
    [num_blocks, block_size, latent_size] in the model's dtype, the latent of the token at
    slot block * block_size + offset at [block, offset]. `head_size` is latent_size and
    `num_kv_heads` 1; `scale` multiplies q.k over the heads' full keys.
    """

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        sliding_window: int | None = None,
        attn_type: AttentionType = AttentionType.DECODER,
        *,
        mla: MLADims,
        kv_b_proj: nn.Module,
    ) -> None:
        if num_kv_heads != 1 or head_size != mla.latent_size:
            raise ValueError(
                f"MLA keeps one latent of size {mla.latent_size} per token, got {num_kv_heads}"
                f" KV heads of size {head_size}"
            )
        if sliding_window is not None or attn_type is not AttentionType.DECODER:
            raise ValueError("MLA serves causal decoder attention over the whole context only")
        super().__init__(num_heads, head_size, scale, num_kv_heads, sliding_window, attn_type)
        self.mla = mla
        self.kv_b_proj = kv_b_proj

    def forward(
        self,
        query: torch.Tensor,  # [T, H, Dn + Dr]
        key: torch.Tensor,  # [T, 1, L]: the new latents
        value: torch.Tensor,  # [T, 1, R]: a view of key (the latent is its own value)
        kv_cache: torch.Tensor,  # [num_blocks, block_size, L]
        attn_metadata: PagedAttentionMetadata,
    ) -> torch.Tensor:  # [T, H, Dv]
        num_tokens = len(attn_metadata.slot_mapping)
        latents = key[:, 0]  # [T, L]
        _write_latents(kv_cache, latents[:num_tokens], attn_metadata.slot_mapping)
        output = query.new_empty(query.shape[0], self.num_heads, self.mla.v_head_dim)
        for chunk in attn_metadata.prefills:
            rows = slice(chunk.start, chunk.end)
            output[rows] = self.forward_prefill(query[rows], latents[rows], kv_cache, chunk)
        decode = attn_metadata.decode
        if decode is not None:
            rows = decode.token_index
            output[rows] = self.forward_decode(query[rows], kv_cache, decode)
        return output

    def forward_prefill(
        self,
        query: torch.Tensor,  # [q_len, H, Dn + Dr]
        latents: torch.Tensor,  # [q_len, L]: the chunk's own
        kv_cache: torch.Tensor,  # [num_blocks, block_size, L]
        chunk: PrefillChunk,
    ) -> torch.Tensor:  # [q_len, H, Dv]
        """The chunk's queries over its context, decompressed into per-head keys/values."""
        q_len, dims = query.shape[0], self.mla
        cacheless = q_len == chunk.seq_len
        context = latents if cacheless else gather_latents(kv_cache, chunk.block_ids)
        context = context[: chunk.seq_len]  # [S, L]
        kv_c, k_pe = context.split([dims.kv_lora_rank, dims.qk_rope_head_dim], dim=-1)
        kv = self.kv_b_proj(kv_c).view(chunk.seq_len, self.num_heads, -1)  # [S, H, Dn + Dv]
        k_nope, v = kv.split([dims.qk_nope_head_dim, dims.v_head_dim], dim=-1)
        k_pe = k_pe[:, None, :].expand(-1, self.num_heads, -1)  # one rotary key for all heads
        k = torch.cat((k_nope, k_pe), dim=-1)  # [S, H, Dn + Dr]
        mask = None
        if not cacheless:
            q_pos = torch.arange(chunk.seq_len - q_len, chunk.seq_len, device=query.device)
            mask = torch.arange(chunk.seq_len, device=query.device) <= q_pos[:, None]
        out = F.scaled_dot_product_attention(
            query.transpose(0, 1)[None],  # [1, H, q_len, Dn + Dr]
            k.transpose(0, 1)[None],  # [1, H, S, Dn + Dr]
            v.transpose(0, 1)[None],  # [1, H, S, Dv]
            attn_mask=mask,
            is_causal=mask is None,
            scale=self.scale,
        )
        return out[0].transpose(0, 1)

    def forward_decode(
        self,
        query: torch.Tensor,  # [B, H, Dn + Dr]
        kv_cache: torch.Tensor,  # [num_blocks, block_size, L]
        decode: DecodeBatch,
    ) -> torch.Tensor:  # [B, H, Dv]
        """Each row's query over its cached latents, with the weights absorbed."""
        dims = self.mla
        w_uk, w_uv = self.absorbed_weights()
        q_nope, q_pe = query.split([dims.qk_nope_head_dim, dims.qk_rope_head_dim], dim=-1)
        q_latent = torch.einsum("bhn,hnr->bhr", q_nope, w_uk)  # [B, H, R]
        q = torch.cat((q_latent, q_pe), dim=-1)  # [B, H, L]
        latents = gather_latents(kv_cache, decode.block_table)  # [B, S, L]
        visible = decode.key_positions < decode.seq_lens[:, None]  # [B, S]
        out = F.scaled_dot_product_attention(
            q[:, None],  # [B, 1, H, L]: the heads are the queries of one KV head
            latents[:, None],  # [B, 1, S, L]
            latents[:, None, :, : dims.kv_lora_rank],  # [B, 1, S, R]
            attn_mask=visible[:, None, None, :],
            scale=self.scale,
        )[:, 0]  # [B, H, R]
        return torch.einsum("bhr,hvr->bhv", out, w_uv)

    def absorbed_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(W_UK [H, Dn, R], W_UV [H, Dv, R]): views of kv_b_proj's current weight."""
        dims = self.mla
        weight = self.kv_b_proj.weight.view(self.num_heads, -1, dims.kv_lora_rank)
        return weight.split([dims.qk_nope_head_dim, dims.v_head_dim], dim=1)


def gather_latents(kv_cache: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """The latents of blocks [..., n] as [..., n * block_size, L] (a contiguous copy)."""
    pages = kv_cache.index_select(0, block_ids.flatten())  # [N, block_size, L]
    return pages.view(*block_ids.shape[:-1], -1, kv_cache.shape[-1])


def _write_latents(kv_cache: torch.Tensor, latents: torch.Tensor, slots: torch.Tensor) -> None:
    """Store the step's latents [N, L] at their slots (slot = block * block_size + offset)."""
    num_blocks, block_size, size = kv_cache.shape
    if kv_cache.is_contiguous():
        kv_cache.view(num_blocks * block_size, size).index_copy_(0, slots, latents)
    else:  # a block-outermost layout interleaves layers: pages are not adjacent
        kv_cache[slots // block_size, slots % block_size] = latents


class TorchRefMLABackend(AttentionBackend):
    """The reference backend's MLA variant (`TorchRefBackend.mla_backend`)."""

    name = "torch_ref_mla"
    capabilities = AttentionCapabilities(
        dtypes=frozenset({torch.float32, torch.float16, torch.bfloat16}), mla=True
    )

    @staticmethod
    def get_impl_cls() -> type[AttentionImpl]:
        return TorchRefMLAImpl

    @staticmethod
    def get_builder_cls() -> type[AttentionMetadataBuilder]:
        return PagedAttentionMetadataBuilder

    @staticmethod
    def get_kv_cache_shape(
        num_blocks: int, block_size: int, num_kv_heads: int, head_size: int
    ) -> tuple[int, ...]:
        """[num_blocks, block_size, head_size]: one latent of head_size per token."""
        if num_kv_heads != 1:
            raise ValueError(f"an MLA cache holds one latent per token, not {num_kv_heads} heads")
        return (num_blocks, block_size, head_size)
