"""The reference attention backend in pure PyTorch: paged KV cache, any device.

Correctness first: each request attends over its own context gathered from its block
table, with an explicit causal (and sliding-window) mask. New queries attend to the
cached context plus the new tokens up to themselves, so one code path serves prefill,
chunked prefill, prefix-cache hits and decode.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from core.attention.interface import (
    AttentionBackend,
    AttentionCapabilities,
    AttentionImpl,
    AttentionMetadataBuilder,
    CommonAttentionMetadata,
)


@dataclass
class TorchRefMetadata:
    query_start_loc: list[int]  # [num_reqs + 1]
    seq_lens: list[int]  # [num_reqs]
    block_table: torch.Tensor  # [num_reqs, max_blocks] int32
    slot_mapping: torch.Tensor  # [num_tokens] int64


class TorchRefMetadataBuilder(AttentionMetadataBuilder):
    def build(self, common: CommonAttentionMetadata) -> TorchRefMetadata:
        return TorchRefMetadata(
            query_start_loc=common.query_start_loc.tolist(),
            seq_lens=common.seq_lens.tolist(),
            block_table=common.block_table,
            slot_mapping=common.slot_mapping,
        )


class TorchRefImpl(AttentionImpl):
    def forward(
        self,
        query: torch.Tensor,  # [T, Hq, D]
        key: torch.Tensor,  # [T, Hkv, D]
        value: torch.Tensor,  # [T, Hkv, D]
        kv_cache: torch.Tensor,  # [num_blocks, 2, block_size, Hkv, D]
        attn_metadata: TorchRefMetadata,
    ) -> torch.Tensor:  # [T, Hq, D]
        block_size = kv_cache.shape[2]
        slots = attn_metadata.slot_mapping  # [T]
        blocks, offsets = slots // block_size, slots % block_size
        kv_cache[blocks, 0, offsets] = key
        kv_cache[blocks, 1, offsets] = value
        output = torch.empty_like(query)
        starts = attn_metadata.query_start_loc
        for i, seq_len in enumerate(attn_metadata.seq_lens):
            q = query[starts[i] : starts[i + 1]]  # [q_len, Hq, D]
            k, v = _gather_context(kv_cache, attn_metadata.block_table[i], seq_len)
            output[starts[i] : starts[i + 1]] = self._attend(q, k, v)
        return output

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q: [q_len, Hq, D] are the last q_len positions of k, v: [seq_len, Hkv, D]."""
        q_len, seq_len = q.shape[0], k.shape[0]
        q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)[:, None]
        k_pos = torch.arange(seq_len, device=q.device)[None, :]
        mask = k_pos <= q_pos  # [q_len, seq_len]
        if self.sliding_window is not None:
            mask &= q_pos - k_pos < self.sliding_window
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1),  # [Hq, q_len, D]
            k.transpose(0, 1),  # [Hkv, seq_len, D]
            v.transpose(0, 1),
            attn_mask=mask,
            scale=self.scale,
            enable_gqa=self.num_heads != self.num_kv_heads,
        )
        return out.transpose(0, 1)  # [q_len, Hq, D]


def _gather_context(
    kv_cache: torch.Tensor, block_ids: torch.Tensor, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first seq_len cached K and V of one request: ([seq_len, Hkv, D], same)."""
    block_size = kv_cache.shape[2]
    num_blocks = -(-seq_len // block_size)
    pages = kv_cache[block_ids[:num_blocks].long()]  # [n, 2, block_size, Hkv, D]
    k = pages[:, 0].flatten(0, 1)[:seq_len]
    v = pages[:, 1].flatten(0, 1)[:seq_len]
    return k, v


class TorchRefBackend(AttentionBackend):
    name = "torch_ref"
    capabilities = AttentionCapabilities(
        dtypes=frozenset({torch.float32, torch.float16, torch.bfloat16}),
    )

    @staticmethod
    def get_impl_cls() -> type[AttentionImpl]:
        return TorchRefImpl

    @staticmethod
    def get_builder_cls() -> type[AttentionMetadataBuilder]:
        return TorchRefMetadataBuilder

    @staticmethod
    def get_kv_cache_shape(
        num_blocks: int, block_size: int, num_kv_heads: int, head_size: int
    ) -> tuple[int, ...]:
        # K and V of one block side by side: a block's page is contiguous, so the
        # KVCacheTensor layouts can place whole pages.
        return (num_blocks, 2, block_size, num_kv_heads, head_size)
