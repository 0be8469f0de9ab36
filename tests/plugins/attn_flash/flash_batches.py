"""Hand-built paged batches for the flash backend's tests, and a float64 dense reference.

A batch is one step over a fresh cache: each request's cached context is written into
its pages directly (Python indexing, no kernel), its new tokens are the step's
query/key/value rows. The reference attends each request's new tokens to its whole
context in float64, straight from the values the batch drew (not from the cache).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from core.attention.interface import CommonAttentionMetadata


@dataclass(frozen=True)
class Request:
    """`num_new` tokens on top of `num_cached` tokens of cached context; (0, 0) is a
    padding request (no tokens, seq_len 0)."""

    num_cached: int
    num_new: int


@dataclass(frozen=True)
class Layer:
    dtype: torch.dtype = torch.float32
    num_kv_heads: int = 2
    gqa_ratio: int = 2
    head_size: int = 32
    block_size: int = 16
    sliding_window: int | None = None

    @property
    def num_heads(self) -> int:
        return self.num_kv_heads * self.gqa_ratio

    @property
    def scale(self) -> float:
        return 1 / math.sqrt(self.head_size)


# Pages of consecutive blocks are this many pages apart in the cache's storage, the middle
# one this layer's (as a block-outermost layout shared by three layers).
PAGES_PER_BLOCK = 3


@dataclass
class Batch:
    layer: Layer
    requests: list[Request]
    common: CommonAttentionMetadata
    query: torch.Tensor  # [T, Hq, D]
    key: torch.Tensor  # [T, Hkv, D]
    value: torch.Tensor  # [T, Hkv, D]
    storage: torch.Tensor  # [num_blocks, PAGES_PER_BLOCK, 2, block_size, Hkv, D]
    contexts: list[tuple[torch.Tensor, torch.Tensor]]  # per request: K, V [seq_len, Hkv, D]
    block_ids: list[list[int]] = field(default_factory=list)

    @property
    def kv_cache(self) -> torch.Tensor:  # [num_blocks, 2, block_size, Hkv, D], strided
        return self.storage[:, 1]

    def rows(self, index: int) -> slice:
        starts = self.common.query_start_loc.tolist()
        return slice(starts[index], starts[index + 1])

    def expected_cache(self) -> torch.Tensor:
        """The storage after the step: every request's whole context in its pages."""
        expected = self.storage.clone()
        for (keys, values), blocks in zip(self.contexts, self.block_ids, strict=True):
            for position in range(keys.shape[0]):
                block, offset = (
                    blocks[position // self.layer.block_size],
                    position % self.layer.block_size,
                )
                expected[block, 1, 0, offset] = keys[position]
                expected[block, 1, 1, offset] = values[position]
        return expected


def make_batch(
    layer: Layer,
    requests: list[Request],
    seed: int = 0,
    padding_tokens: int = 0,
    max_query_len: int | None = None,
    max_seq_len: int | None = None,
) -> Batch:
    """The step of `requests` (in batch order) with `padding_tokens` rows of slot -1 after
    the real ones; `max_query_len` / `max_seq_len` override the exact maxima (upper bounds)."""
    gen = torch.Generator().manual_seed(seed)
    bs = layer.block_size
    seq_lens = [r.num_cached + r.num_new for r in requests]
    num_blocks = sum(-(-n // bs) for n in seq_lens) + 2  # block 0 (null) and a spare stay empty
    pool = iter((torch.randperm(num_blocks - 1, generator=gen) + 1).tolist())
    block_ids = [[next(pool) for _ in range(-(-n // bs))] for n in seq_lens]
    storage = torch.zeros(
        num_blocks, PAGES_PER_BLOCK, 2, bs, layer.num_kv_heads, layer.head_size, dtype=layer.dtype
    )

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(layer.dtype)

    contexts, slots = [], []
    for request, blocks in zip(requests, block_ids, strict=True):
        length = request.num_cached + request.num_new
        keys = draw(length, layer.num_kv_heads, layer.head_size)
        values = draw(length, layer.num_kv_heads, layer.head_size)
        contexts.append((keys, values))
        for position in range(length):
            block, offset = blocks[position // bs], position % bs
            if position < request.num_cached:
                storage[block, 1, 0, offset] = keys[position]
                storage[block, 1, 1, offset] = values[position]
            else:
                slots.append(block * bs + offset)
    num_tokens = len(slots) + padding_tokens
    slots += [-1] * padding_tokens
    # The new tokens' K/V rows in batch order, then the padding rows' (never stored).
    key, value = (
        torch.cat(
            [ctx[part][r.num_cached :] for ctx, r in zip(contexts, requests, strict=True)]
            + [draw(padding_tokens, layer.num_kv_heads, layer.head_size)]
        )
        for part in (0, 1)
    )
    query = draw(num_tokens, layer.num_heads, layer.head_size)

    width = max((len(b) for b in block_ids), default=0) + 1
    table = torch.zeros(len(requests), width, dtype=torch.int32)
    for row, blocks in enumerate(block_ids):
        table[row, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
    starts = torch.zeros(len(requests) + 1, dtype=torch.int32)
    starts[1:] = torch.tensor([r.num_new for r in requests]).cumsum(0)
    common = CommonAttentionMetadata(
        query_start_loc=starts,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        num_computed_tokens=torch.tensor([r.num_cached for r in requests], dtype=torch.int32),
        block_table=table,
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        num_reqs=len(requests),
        num_actual_tokens=num_tokens,
        max_query_len=max_query_len or max(r.num_new for r in requests),
        max_seq_len=max_seq_len or max(seq_lens),
    )
    return Batch(layer, requests, common, query, key, value, storage, contexts, block_ids)


def reference_output(batch: Batch) -> torch.Tensor:
    """float64 [T, Hq, D]: each new token over its request's keys at positions
    [max(0, p - window + 1), p]; rows of no request are zero."""
    layer = batch.layer
    out = torch.zeros(batch.query.shape, dtype=torch.float64)
    for index, (request, (keys, values)) in enumerate(
        zip(batch.requests, batch.contexts, strict=True)
    ):
        if request.num_new == 0:
            continue
        rows = batch.rows(index)
        q = batch.query[rows].double().transpose(0, 1)  # [Hq, q_len, D]
        k = keys.double().repeat_interleave(layer.gqa_ratio, 1).transpose(0, 1)  # [Hq, L, D]
        v = values.double().repeat_interleave(layer.gqa_ratio, 1).transpose(0, 1)
        q_pos = torch.arange(request.num_cached, request.num_cached + request.num_new)[:, None]
        k_pos = torch.arange(keys.shape[0])[None, :]
        visible = k_pos <= q_pos
        if layer.sliding_window is not None:
            visible &= q_pos - k_pos < layer.sliding_window
        scores = (q @ k.transpose(1, 2)) * layer.scale  # [Hq, q_len, L]
        weights = scores.masked_fill(~visible, -math.inf).softmax(-1)
        out[rows] = (weights @ v).transpose(0, 1)
    return out
