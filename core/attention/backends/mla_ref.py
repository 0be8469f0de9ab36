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

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from core.attention.interface import AttentionCapabilities, AttentionImpl, AttentionType, MLADims
from core.attention.paged_metadata import (
    DecodeBatch,
    PagedAttentionMetadata,
    PagedMetadataBackend,
    PrefillChunk,
)

__all__ = ["TorchRefMLABackend", "TorchRefMLAImpl"]


class TorchRefMLAImpl(AttentionImpl):
    """The reference MLA kernel (the forward contract is written on `MLADims`), and the
    class a kernel plugin subclasses to replace one half.

    `forward` stores the step's latents at `slot_mapping`, then calls `forward_prefill`
    once per prefill chunk and, with W_UK absorbed into the decode rows' queries,
    `forward_decode` once for the decode batch, and places their rows in the output. The
    hooks are the kernel seam, as on `TorchRefImpl`: a subclass overrides either one
    (cpu_kernels replaces `forward_decode` with a C++ kernel) and inherits the rest; its
    backend subclasses `TorchRefMLABackend`. Both hooks run with the step's latents
    already in the cache, read it, write nothing but their result, and return it in the
    query's dtype.

    KV layout (`TorchRefMLABackend.get_kv_cache_shape`): `kv_cache` is
    [num_blocks, block_size, latent_size] in the model's dtype, the latent of the token at
    slot block * block_size + offset at [block, offset]. `head_size` is latent_size and
    `num_kv_heads` 1; `scale` multiplies q.k over the heads' full keys.
    """

    def __init__(self, *args: Any, mla: MLADims, kv_b_proj: nn.Module, **kwargs: Any) -> None:
        """`AttentionImpl`'s arguments, and the layer's sizes and kv_b_proj (`MLADims`)."""
        super().__init__(*args, **kwargs)
        if self.num_kv_heads != 1 or self.head_size != mla.latent_size:
            raise ValueError(
                f"MLA keeps one latent of size {mla.latent_size} per token, got "
                f"{self.num_kv_heads} KV heads of size {self.head_size}"
            )
        if self.sliding_window is not None or self.attn_type is not AttentionType.DECODER:
            raise ValueError("MLA serves causal decoder attention over the whole context only")
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
            output[rows] = self._decode_absorbed(query[rows], kv_cache, decode)
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

    def _decode_absorbed(
        self,
        query: torch.Tensor,  # [B, H, Dn + Dr]
        kv_cache: torch.Tensor,  # [num_blocks, block_size, L]
        decode: DecodeBatch,
    ) -> torch.Tensor:  # [B, H, Dv]
        """Each row's query over its cached latents, with the weights absorbed: W_UK
        folded into the query, `forward_decode` over the latents, W_UV applied after."""
        dims = self.mla
        w_uk, w_uv = self.absorbed_weights()
        q_nope, q_pe = query.split([dims.qk_nope_head_dim, dims.qk_rope_head_dim], dim=-1)
        q_latent = torch.einsum("bhn,hnr->bhr", q_nope, w_uk)  # [B, H, R]
        out = self.forward_decode(torch.cat((q_latent, q_pe), dim=-1), kv_cache, decode)
        return torch.einsum("bhr,hvr->bhv", out, w_uv)

    def forward_decode(
        self,
        query: torch.Tensor,  # [B, H, L]: [W_UK^T q_nope | q_pe] per head
        kv_cache: torch.Tensor,  # [num_blocks, block_size, L]
        decode: DecodeBatch,
    ) -> torch.Tensor:  # [B, H, R]
        """The decode hook: row i's heads over its cached latents as one KV head (MQA).

        Head h of row i returns sum_t w_t * c_t[:kv_lora_rank], w = softmax_t(scale *
        query[i, h] . c_t), over the latents c_t at positions [0, decode.seq_lens[i]),
        read from `kv_cache` through `decode.block_table[i]` (the row's new latent
        included). The query is already in latent space, so its dot product with a
        latent is the head's q.k over its full key; the caller applies W_UV.
        """
        latents = gather_latents(kv_cache, decode.block_table)  # [B, S, L]
        visible = decode.key_positions < decode.seq_lens[:, None]  # [B, S]
        return F.scaled_dot_product_attention(
            query[:, None],  # [B, 1, H, L]: the heads are the queries of one KV head
            latents[:, None],  # [B, 1, S, L]
            latents[:, None, :, : self.mla.kv_lora_rank],  # [B, 1, S, R]
            attn_mask=visible[:, None, None, :],
            scale=self.scale,
        )[:, 0]

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


class TorchRefMLABackend(PagedMetadataBackend):
    """The reference backend's MLA variant (`TorchRefBackend.mla_backend`)."""

    name = "torch_ref_mla"
    capabilities = AttentionCapabilities(
        dtypes=frozenset({torch.float32, torch.float16, torch.bfloat16}), mla=True
    )

    @staticmethod
    def get_impl_cls() -> type[AttentionImpl]:
        return TorchRefMLAImpl

    @staticmethod
    def get_kv_cache_shape(
        num_blocks: int, block_size: int, num_kv_heads: int, head_size: int
    ) -> tuple[int, ...]:
        """[num_blocks, block_size, head_size]: one latent of head_size per token."""
        if num_kv_heads != 1:
            raise ValueError(f"an MLA cache holds one latent per token, not {num_kv_heads} heads")
        return (num_blocks, block_size, head_size)
