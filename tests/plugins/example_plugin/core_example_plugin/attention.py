"""`example_paged`: paged attention written plainly, one request at a time.

Each request's context is read by walking its block table position by position
(slot = block_ids[p // block_size] * block_size + p % block_size), and attention is a
float32 softmax over explicit scores. Slow, but short enough to check by eye, and
written against the public interface only, with the reference's KV layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from core.attention.interface import (
    AttentionBackend,
    AttentionCapabilities,
    AttentionImpl,
    AttentionMetadataBuilder,
    CommonAttentionMetadata,
)


@dataclass
class RequestSpan:
    """One request's new tokens: rows [start, end) of the step, context `seq_len`."""

    start: int
    end: int
    seq_len: int
    block_ids: torch.Tensor  # [num_blocks] int64


@dataclass
class ExampleMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64
    requests: list[RequestSpan]


class ExampleMetadataBuilder(AttentionMetadataBuilder):
    def build(self, common: CommonAttentionMetadata) -> ExampleMetadata:
        starts = common.query_start_loc.tolist()
        seq_lens = common.seq_lens.tolist()
        requests = [
            RequestSpan(starts[i], starts[i + 1], seq_lens[i], common.block_table[i].long())
            for i in range(common.num_reqs)
        ]
        return ExampleMetadata(common.slot_mapping.long(), requests)


class ExampleImpl(AttentionImpl):
    def forward(
        self,
        query: torch.Tensor,  # [T, Hq, D]
        key: torch.Tensor,  # [T, Hkv, D]
        value: torch.Tensor,  # [T, Hkv, D]
        kv_cache: torch.Tensor,  # [num_blocks, 2, block_size, Hkv, D]
        attn_metadata: ExampleMetadata,
    ) -> torch.Tensor:  # [T, Hq, D]
        block_size = kv_cache.shape[2]
        slots = attn_metadata.slot_mapping
        kv_cache[slots // block_size, 0, slots % block_size] = key
        kv_cache[slots // block_size, 1, slots % block_size] = value
        output = torch.empty_like(query)
        for span in attn_metadata.requests:
            output[span.start : span.end] = self._attend(
                query[span.start : span.end], kv_cache, span
            )
        return output

    def _attend(
        self, q: torch.Tensor, kv_cache: torch.Tensor, span: RequestSpan
    ) -> torch.Tensor:  # q: [n, Hq, D] -> [n, Hq, D]
        block_size = kv_cache.shape[2]
        positions = torch.arange(span.seq_len)  # every key of the context
        blocks = span.block_ids[positions // block_size]
        k = kv_cache[blocks, 0, positions % block_size].float()  # [L, Hkv, D]
        v = kv_cache[blocks, 1, positions % block_size].float()
        group = self.num_heads // self.num_kv_heads  # query head h reads KV head h // group
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # [L, Hq, D]
        scores = torch.einsum("nhd,lhd->hnl", q.float(), k) * self.scale  # [Hq, n, L]
        q_pos = torch.arange(span.seq_len - q.shape[0], span.seq_len)[:, None]  # [n, 1]
        visible = positions[None, :] <= q_pos  # [n, L]
        if self.sliding_window is not None:
            visible &= q_pos - positions[None, :] < self.sliding_window
        probs = scores.masked_fill(~visible, float("-inf")).softmax(dim=-1)
        return torch.einsum("hnl,lhd->nhd", probs, v).to(q.dtype)


class ExamplePagedBackend(AttentionBackend):
    name = "example_paged"
    capabilities = AttentionCapabilities(
        dtypes=frozenset({torch.float32, torch.bfloat16}),
        block_sizes=frozenset({8, 16}),
    )

    @staticmethod
    def get_impl_cls() -> type[AttentionImpl]:
        return ExampleImpl

    @staticmethod
    def get_builder_cls() -> type[AttentionMetadataBuilder]:
        return ExampleMetadataBuilder

    @staticmethod
    def get_kv_cache_shape(
        num_blocks: int, block_size: int, num_kv_heads: int, head_size: int
    ) -> tuple[int, ...]:
        return (num_blocks, 2, block_size, num_kv_heads, head_size)
