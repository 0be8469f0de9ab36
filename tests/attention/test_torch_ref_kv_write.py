"""The reference backend stores K/V at the right slots in either KV-cache layout."""

from __future__ import annotations

import pytest
import torch

from core.attention.backends.torch_ref import _write_kv
from core.attention.paged_metadata import PagedAttentionMetadata
from core.kv_cache.layout import KVCacheTensor, create_kv_cache_view

NUM_BLOCKS, BLOCK, HEADS, DIM = 6, 4, 2, 3
PAGE = (2, BLOCK, HEADS, DIM)


@pytest.mark.parametrize("layout", ["layer_outermost", "block_outermost"])
def test_kv_lands_in_its_slot(layout):
    page_bytes = 2 * BLOCK * HEADS * DIM * 4
    tensor = getattr(KVCacheTensor, layout)(("a", "b"), NUM_BLOCKS, page_bytes)
    buffer = torch.zeros(tensor.size, dtype=torch.int8)
    cache = create_kv_cache_view(buffer, tensor, "b", NUM_BLOCKS, PAGE, torch.float32)
    other = create_kv_cache_view(buffer, tensor, "a", NUM_BLOCKS, PAGE, torch.float32)
    slots = torch.tensor([5, 13, 22])  # blocks 1, 3, 5 at offsets 1, 1, 2
    key = torch.arange(3 * HEADS * DIM, dtype=torch.float32).view(3, HEADS, DIM) + 1
    _write_kv(cache, key, -key, PagedAttentionMetadata(slots, [], None))
    for i, slot in enumerate(slots.tolist()):
        assert torch.equal(cache[slot // BLOCK, 0, slot % BLOCK], key[i])
        assert torch.equal(cache[slot // BLOCK, 1, slot % BLOCK], -key[i])
    assert int((cache != 0).sum()) == 2 * key.numel()  # nothing else written
    assert not other.any()  # the other layer is untouched


def test_a_steps_cache_rows_are_computed_once_and_serve_every_layer():
    metadata = PagedAttentionMetadata(torch.tensor([5, 13, 22]), [], None)
    # blocks 1, 3, 5 at offsets 1, 1, 2; a block is 2 * 4 rows (its K rows, then its V rows)
    assert metadata.key_rows(4).tolist() == [9, 25, 42]
    assert metadata.key_rows(4) is metadata.key_rows(4)
    assert metadata.key_rows(8).tolist() == [5, 21, 38]  # blocks 0, 1, 2 of 2 * 8 rows
    layers = [torch.zeros(NUM_BLOCKS, *PAGE) for _ in range(2)]
    key = torch.ones(3, HEADS, DIM)
    for cache in layers:
        _write_kv(cache, key, -key, metadata)
    for cache in layers:
        assert cache[1, 0, 1].eq(1).all() and cache[5, 1, 2].eq(-1).all()
        assert int((cache != 0).sum()) == 2 * key.numel()
