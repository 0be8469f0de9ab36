"""Where KV-cache pages live in memory: KVCacheTensor, KVCacheConfig and tensor views.

A KVCacheTensor is one flat byte buffer shared by several layers of equal page size.
Two layouts place them:
- layer-outermost: each layer owns a contiguous region of `num_blocks` pages
  (layer_stride = page_size * num_blocks, block_stride = page_size);
- block-outermost: each block holds the pages of all the layers side by side
  (block_stride = page_size * num_layers, layer_stride = page_size), which lets one
  contiguous copy move a whole block of every layer (useful for KV transfer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from core.kv_cache.spec import KVCacheSpec


@dataclass(frozen=True)
class KVCacheTensor:
    """One buffer of `size` bytes holding the pages of `shared_by` (layer names)."""

    size: int
    shared_by: tuple[str, ...]
    layer_stride: int
    block_stride: int

    @classmethod
    def layer_outermost(
        cls, layer_names: tuple[str, ...], num_blocks: int, page_size: int
    ) -> KVCacheTensor:
        layer_stride = page_size * num_blocks
        return cls(layer_stride * len(layer_names), layer_names, layer_stride, page_size)

    @classmethod
    def block_outermost(
        cls, layer_names: tuple[str, ...], num_blocks: int, page_size: int
    ) -> KVCacheTensor:
        block_stride = page_size * len(layer_names)
        return cls(block_stride * num_blocks, layer_names, page_size, block_stride)

    def byte_offset(self, layer_name: str, block_id: int) -> int:
        """Where `block_id`'s page of `layer_name` starts in the buffer."""
        layer_index = self.shared_by.index(layer_name)
        return layer_index * self.layer_stride + block_id * self.block_stride


@dataclass(frozen=True)
class KVCacheGroupSpec:
    """Layers that share one spec, and so one block table."""

    layer_names: tuple[str, ...]
    kv_cache_spec: KVCacheSpec


@dataclass(frozen=True)
class KVCacheConfig:
    """What the engine tells the worker to allocate (DESIGN.md section 3, step 2)."""

    num_blocks: int
    kv_cache_tensors: tuple[KVCacheTensor, ...]
    kv_cache_groups: tuple[KVCacheGroupSpec, ...]


def create_kv_cache_view(
    buffer: torch.Tensor,
    tensor: KVCacheTensor,
    layer_name: str,
    num_blocks: int,
    page_shape: tuple[int, ...],
    dtype: torch.dtype,
) -> torch.Tensor:
    """A [num_blocks, *page_shape] view of `layer_name`'s pages inside `buffer`.

    `buffer` is the flat int8 allocation of `tensor`; the page itself is contiguous, and
    consecutive blocks are `tensor.block_stride` bytes apart whatever the layout.
    """
    itemsize = torch.empty((), dtype=dtype).element_size()
    page_bytes = math.prod(page_shape) * itemsize
    room = tensor.block_stride
    if len(tensor.shared_by) > 1:
        room = min(room, tensor.layer_stride)
    if page_bytes > room:
        raise ValueError(f"a page of {page_bytes} bytes overlaps its neighbour in {layer_name}")
    for stride in (tensor.layer_stride, tensor.block_stride):
        if stride % itemsize:
            raise ValueError(f"stride {stride} is not a multiple of the {dtype} item size")
    typed = buffer.view(dtype)  # [size / itemsize]
    inner = [math.prod(page_shape[i + 1 :]) for i in range(len(page_shape))]
    return torch.as_strided(
        typed,
        size=(num_blocks, *page_shape),
        stride=(tensor.block_stride // itemsize, *inner),
        storage_offset=tensor.byte_offset(layer_name, 0) // itemsize,
    )
