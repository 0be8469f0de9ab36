"""The reference backend's forward: K/V written, then one hook call per chunk and decode batch.

Expected outputs come from a dense per-query softmax written here, not from the backend.
"""

from __future__ import annotations

import pytest
import torch
from paged_steps import paged_step

from core.attention.backends.torch_ref import TorchRefBackend, TorchRefImpl
from core.attention.paged_metadata import DecodeBatch
from core.kv_cache.spec import FullAttentionSpec

BLOCK, HEADS, KV_HEADS, DIM, NUM_BLOCKS = 4, 4, 2, 8, 24
# (cached tokens, new tokens) per request: a fresh prompt, a chunk after a prefix-cache
# hit, a one-token chunk, decodes ending mid-block and on a block edge.
REQUESTS = [(0, 5), (6, 3), (8, 1), (9, 1), (15, 1)]


def dense_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None
) -> torch.Tensor:  # q: [n, Hq, D] at the last n positions of k, v: [seq_len, Hkv, D]
    seq_len, group = k.shape[0], HEADS // KV_HEADS
    out = torch.empty_like(q)
    for i in range(q.shape[0]):
        pos = seq_len - q.shape[0] + i
        first = 0 if window is None else max(0, pos - window + 1)
        for h in range(HEADS):
            keys, values = k[first : pos + 1, h // group], v[first : pos + 1, h // group]
            weights = torch.softmax(keys @ q[i, h] * DIM**-0.5, dim=0)
            out[i, h] = weights @ values
    return out


def step(generator: torch.Generator, requests: list[tuple[int, int]] = REQUESTS):
    """A cache holding each request's cached K/V, and the step's metadata and tensors."""
    spec = FullAttentionSpec(
        block_size=BLOCK, num_kv_heads=KV_HEADS, head_size=DIM, dtype=torch.float32
    )
    tables, starts, metadata = paged_step(generator, requests, spec, NUM_BLOCKS)
    cache = torch.zeros(TorchRefBackend.get_kv_cache_shape(NUM_BLOCKS, BLOCK, KV_HEADS, DIM))
    contexts = []
    for blocks, (cached, new) in zip(tables, requests, strict=True):
        k, v = torch.randn(2, cached + new, KV_HEADS, DIM, generator=generator)
        for pos in range(cached):
            cache[blocks[pos // BLOCK], 0, pos % BLOCK] = k[pos]
            cache[blocks[pos // BLOCK], 1, pos % BLOCK] = v[pos]
        contexts.append((k, v))
    return cache, metadata, contexts, starts


# Decode rows after the prefills (a slice), between them (an index), and alone (the whole
# step: the hook's output is the step's).
ORDERS = {
    "decodes last": REQUESTS,
    "decodes between prefills": [(8, 1), (0, 5), (9, 1), (6, 3), (15, 1)],
    "decodes alone": [(8, 1), (9, 1), (15, 1), (3, 1)],
}


@pytest.mark.parametrize("order", sorted(ORDERS))
@pytest.mark.parametrize("window", [None, 3])
def test_forward_equals_dense_attention_over_each_context(window, order):
    requests = ORDERS[order]
    gen = torch.Generator().manual_seed(0)
    cache, metadata, contexts, starts = step(gen, requests)
    query = torch.randn(starts[-1], HEADS, DIM, generator=gen)
    key = torch.cat([k[c:] for (k, _), (c, _) in zip(contexts, requests, strict=True)])
    value = torch.cat([v[c:] for (_, v), (c, _) in zip(contexts, requests, strict=True)])

    out = TorchRefImpl(HEADS, DIM, DIM**-0.5, KV_HEADS, window).forward(
        query, key, value, cache, metadata
    )
    for i, (k, v) in enumerate(contexts):
        rows = slice(starts[i], starts[i + 1])
        expected = dense_attention(query[rows], k, v, window)
        torch.testing.assert_close(out[rows], expected, atol=1e-5, rtol=1e-5)


class RecordingImpl(TorchRefImpl):
    """Overrides only the public decode hook, as a kernel plugin does."""

    def __init__(self) -> None:
        super().__init__(HEADS, DIM, DIM**-0.5, KV_HEADS)
        self.calls: list[tuple[torch.Tensor, DecodeBatch]] = []

    def forward_decode(
        self, query: torch.Tensor, kv_cache: torch.Tensor, decode: DecodeBatch
    ) -> torch.Tensor:
        self.calls.append((query.clone(), decode))
        return torch.full_like(query, 7.0)


def test_forward_calls_the_decode_hook_once_with_the_one_token_rows():
    gen = torch.Generator().manual_seed(1)
    cache, metadata, _, starts = step(gen)
    query = torch.randn(starts[-1], HEADS, DIM, generator=gen)
    key, value = torch.randn(2, starts[-1], KV_HEADS, DIM, generator=gen)
    impl = RecordingImpl()

    out = impl.forward(query, key, value, cache, metadata)
    decode_rows = [8, 9, 10]  # requests 2..4 have one new token each, after 5 + 3 rows
    assert [(c.start, c.end, c.seq_len) for c in metadata.prefills] == [(0, 5, 5), (5, 8, 9)]
    ((seen, decode),) = impl.calls
    assert decode.token_index.tolist() == decode_rows
    assert decode.seq_lens.tolist() == [9, 10, 16]
    assert decode.block_table.shape == (3, 4) and decode.block_table.dtype == torch.int64
    assert torch.equal(seen, query[decode_rows])
    assert (out[decode_rows] == 7.0).all() and not (out[:8] == 7.0).any()


@pytest.mark.parametrize(
    ("order", "rows", "token_rows"),
    [
        ("decodes last", [8, 9, 10], slice(8, 11)),
        ("decodes between prefills", [0, 6, 10], None),
        ("decodes alone", [0, 1, 2, 3], slice(0, 4)),
    ],
)
def test_the_decode_rows_are_also_a_slice_when_consecutive(order, rows, token_rows):
    gen = torch.Generator().manual_seed(3)
    cache, metadata, _, starts = step(gen, ORDERS[order])
    query = torch.randn(starts[-1], HEADS, DIM, generator=gen)
    key, value = torch.randn(2, starts[-1], KV_HEADS, DIM, generator=gen)
    impl = RecordingImpl()

    out = impl.forward(query, key, value, cache, metadata)
    ((seen, decode),) = impl.calls
    assert decode.token_index.tolist() == rows and decode.token_rows == token_rows
    assert torch.equal(seen, query[rows])
    others = [i for i in range(starts[-1]) if i not in rows]
    assert (out[rows] == 7.0).all() and not (out[others] == 7.0).any()


def test_the_hooks_see_the_steps_keys_already_in_the_cache():
    gen = torch.Generator().manual_seed(2)
    cache, metadata, _, starts = step(gen)
    key, value = torch.randn(2, starts[-1], KV_HEADS, DIM, generator=gen)
    impl = RecordingImpl()
    impl.forward(torch.randn(starts[-1], HEADS, DIM), key, value, cache, metadata)

    ((_, decode),) = impl.calls
    for row, seq_len, blocks in zip(
        decode.token_index.tolist(), decode.seq_lens.tolist(), decode.block_table, strict=True
    ):
        pos = seq_len - 1  # the new token
        page = cache[blocks[pos // BLOCK], :, pos % BLOCK]  # [2, Hkv, D]
        assert torch.equal(page[0], key[row]) and torch.equal(page[1], value[row])
