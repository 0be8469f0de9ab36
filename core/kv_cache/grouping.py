"""From the worker's per-layer specs to KV-cache groups and a KVCacheConfig.

Layers with equal specs share one group: one block table, one set of block ids per
request. The engine side chooses `num_blocks` from its memory budget; this module only
lays the blocks out (DESIGN.md section 3, step 2).
"""

from __future__ import annotations

from collections.abc import Mapping

from core.kv_cache.layout import KVCacheConfig, KVCacheGroupSpec, KVCacheTensor
from core.kv_cache.spec import KVCacheSpec


def group_layers(specs: Mapping[str, KVCacheSpec]) -> tuple[KVCacheGroupSpec, ...]:
    """Groups of layers with equal specs, in the order each spec first appears."""
    by_spec: dict[KVCacheSpec, list[str]] = {}
    for layer_name, spec in specs.items():
        by_spec.setdefault(spec, []).append(layer_name)
    return tuple(KVCacheGroupSpec(tuple(names), spec) for spec, names in by_spec.items())


def kv_cache_config_for_blocks(specs: Mapping[str, KVCacheSpec], num_blocks: int) -> KVCacheConfig:
    """A config giving every group `num_blocks` blocks, one layer-outermost tensor each."""
    if num_blocks < 1:
        raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
    groups = group_layers(specs)
    tensors = tuple(
        KVCacheTensor.layer_outermost(g.layer_names, num_blocks, g.kv_cache_spec.page_size_bytes)
        for g in groups
    )
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=tensors, kv_cache_groups=groups)


def kv_cache_bytes_per_block(specs: Mapping[str, KVCacheSpec]) -> int:
    """Bytes one block id costs across every layer (for budget sizing)."""
    return sum(spec.page_size_bytes for spec in specs.values())
