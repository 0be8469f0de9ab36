"""The reference backend stores K/V at the right slots in either KV-cache layout."""

from __future__ import annotations

import pytest
import torch

from core.attention.backends.torch_ref import _write_kv
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
    _write_kv(cache, key, -key, slots)
    for i, slot in enumerate(slots.tolist()):
        assert torch.equal(cache[slot // BLOCK, 0, slot % BLOCK], key[i])
        assert torch.equal(cache[slot // BLOCK, 1, slot % BLOCK], -key[i])
    assert int((cache != 0).sum()) == 2 * key.numel()  # nothing else written
    assert not other.any()  # the other layer is untouched
