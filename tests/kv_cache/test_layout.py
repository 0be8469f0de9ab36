"""KVCacheTensor layouts and the per-layer views created over one flat buffer."""

from __future__ import annotations

import pytest
import torch

from core.kv_cache.layout import KVCacheTensor, create_kv_cache_view

LAYERS = ("l0", "l1", "l2")
PAGE_SHAPE = (2, 4, 1, 2)  # [K/V, block_size, num_kv_heads, head_size]
PAGE_BYTES = 16 * 4  # float32


def views(tensor: KVCacheTensor, num_blocks: int) -> tuple[torch.Tensor, dict]:
    buffer = torch.zeros(tensor.size, dtype=torch.int8)
    made = {
        name: create_kv_cache_view(buffer, tensor, name, num_blocks, PAGE_SHAPE, torch.float32)
        for name in LAYERS
    }
    return buffer, made


@pytest.mark.parametrize("layout", ["layer_outermost", "block_outermost"])
def test_each_layer_block_page_is_distinct_and_where_the_tensor_says(layout):
    num_blocks = 5
    tensor = getattr(KVCacheTensor, layout)(LAYERS, num_blocks, PAGE_BYTES)
    assert tensor.size == PAGE_BYTES * num_blocks * len(LAYERS)
    buffer, made = views(tensor, num_blocks)
    for i, name in enumerate(LAYERS):
        for block in range(num_blocks):
            made[name][block].fill_(100 * i + block + 1)
    floats = buffer.view(torch.float32)
    for i, name in enumerate(LAYERS):
        for block in range(num_blocks):
            start = tensor.byte_offset(name, block) // 4
            assert torch.all(floats[start : start + 16] == 100 * i + block + 1)


def test_layer_outermost_strides():
    tensor = KVCacheTensor.layer_outermost(LAYERS, 5, PAGE_BYTES)
    assert (tensor.layer_stride, tensor.block_stride) == (5 * 64, 64)
    assert tensor.byte_offset("l1", 2) == 5 * 64 + 2 * 64


def test_block_outermost_keeps_a_block_of_all_layers_contiguous():
    tensor = KVCacheTensor.block_outermost(LAYERS, 5, PAGE_BYTES)
    assert (tensor.layer_stride, tensor.block_stride) == (64, 3 * 64)
    assert tensor.byte_offset("l2", 1) == 3 * 64 + 2 * 64


def test_page_larger_than_its_room_is_refused():
    tensor = KVCacheTensor.block_outermost(LAYERS, 5, PAGE_BYTES // 2)
    buffer = torch.zeros(tensor.size, dtype=torch.int8)
    with pytest.raises(ValueError, match="overlaps"):
        create_kv_cache_view(buffer, tensor, "l0", 5, PAGE_SHAPE, torch.float32)
