"""KVCacheCoordinator and the per-spec managers: full + sliding-window groups."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from core.kv_cache import builtin_specs
from core.kv_cache.block_hash import make_block_hasher
from core.kv_cache.block_pool import BlockPool
from core.kv_cache.coordinator import KVCacheCoordinator
from core.kv_cache.grouping import kv_cache_config_for_blocks
from core.kv_cache.kv_cache_manager import KVCacheManager
from core.kv_cache.registry import KVCacheSpecRegistry
from core.kv_cache.single_type_manager import FullAttentionManager, SlidingWindowManager
from core.kv_cache.spec import FullAttentionSpec, SlidingWindowSpec
from core.request import Request, RequestStatus
from core.sampling_params import SamplingParams

BLOCK_SIZE = 4


def full_spec(block_size: int = BLOCK_SIZE) -> FullAttentionSpec:
    return FullAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=2, dtype=torch.float32
    )


def window_spec(window: int) -> SlidingWindowSpec:
    return SlidingWindowSpec(
        block_size=BLOCK_SIZE,
        num_kv_heads=1,
        head_size=2,
        dtype=torch.float32,
        sliding_window=window,
    )


def builtin_registry() -> KVCacheSpecRegistry:
    registry = KVCacheSpecRegistry()
    builtin_specs.register(registry)
    return registry


def make_request(request_id: str, tokens: list[int]) -> Request:
    hasher = make_block_hasher(BLOCK_SIZE)
    return Request(request_id, tokens, SamplingParams(), None, 0.0, block_hasher=hasher)


def cache_then_free(manager, req: Request) -> list:
    """Run the request through the manager so its full blocks end up cached and free."""
    blocks = manager.allocate_new_blocks(req.request_id, req.num_tokens)
    manager.cache_blocks(req, req.num_tokens)
    manager.free(req.request_id, req.num_tokens)
    return blocks


def hybrid_manager(window: int, num_blocks: int = 10) -> KVCacheManager:
    specs = {"layers.0.full": full_spec(), "layers.1.swa": window_spec(window)}
    config = kv_cache_config_for_blocks(specs, num_blocks)
    return KVCacheManager(config, max_model_len=64, spec_registry=builtin_registry(), watermark=0)


def test_sliding_window_frees_out_of_window_blocks_to_the_null_block():
    manager = hybrid_manager(window=4)
    req = make_request("a", list(range(12)))
    manager.allocate_slots(req, 12)
    req.status, req.num_computed_tokens = RequestStatus.RUNNING, 12
    assert manager.get_block_ids("a") == ([1, 2, 3], [1, 2, 3])
    req.append_output_token_ids(12)
    new = manager.allocate_slots(req, 1)
    # Token 12 sees tokens 9..12: blocks 0 and 1 (tokens 0..7) leave the window group.
    assert new.get_block_ids() == ([4], [4])
    assert manager.get_block_ids("a") == ([1, 2, 3, 4], [0, 0, 3, 4])
    full_pool, swa_pool = manager.coordinator.block_pools
    assert [b.ref_cnt for b in swa_pool.blocks[:5]] == [0, 0, 0, 1, 1]
    assert [b.ref_cnt for b in full_pool.blocks[:5]] == [0, 1, 1, 1, 1]
    assert swa_pool.get_num_free_blocks() == 7
    manager.free(req)
    assert all(b.ref_cnt == 0 for pool in (full_pool, swa_pool) for b in pool.blocks)
    assert [pool.get_num_free_blocks() for pool in (full_pool, swa_pool)] == [9, 9]


def test_sliding_window_hit_needs_only_the_blocks_inside_the_window():
    # window 6: a hit ending at a block boundary needs the 5 tokens before it, 2 blocks.
    manager = SlidingWindowManager(window_spec(6), BlockPool(8))
    req = make_request("a", list(range(17)))
    blocks = cache_then_free(manager, req)
    manager.block_pool.uncache_blocks([blocks[0], blocks[1]])  # as if evicted
    hits = manager.find_longest_cache_hit(req.block_hashes, 16)
    assert [b.block_id for b in hits] == [0, 0, 3, 4]


def test_sliding_window_hit_falls_back_to_a_run_from_block_0():
    manager = SlidingWindowManager(window_spec(6), BlockPool(8))
    req = make_request("a", list(range(17)))
    blocks = cache_then_free(manager, req)
    manager.block_pool.uncache_blocks([blocks[2]])
    # Blocks 3 alone is too short a run; blocks 0-1 start the sequence, nothing precedes.
    assert [b.block_id for b in manager.find_longest_cache_hit(req.block_hashes, 16)] == [1, 2]


def test_full_attention_hit_stops_at_the_first_missing_block():
    manager = FullAttentionManager(full_spec(), BlockPool(8))
    req = make_request("a", list(range(16)))
    blocks = cache_then_free(manager, req)
    manager.block_pool.uncache_blocks([blocks[2]])
    assert [b.block_id for b in manager.find_longest_cache_hit(req.block_hashes, 16)] == [1, 2]
    assert [b.block_id for b in manager.find_longest_cache_hit(req.block_hashes, 7)] == [1]


def test_coordinator_hit_is_a_length_every_group_accepts():
    config = kv_cache_config_for_blocks(
        {"layers.0.full": full_spec(), "layers.1.swa": window_spec(6)}, 8
    )
    coordinator = KVCacheCoordinator(config, True, builtin_registry())
    full, swa = coordinator.managers
    req = make_request("a", list(range(13)))
    cache_then_free(full, req)
    swa_blocks = cache_then_free(swa, req)
    # Full attention could serve 12 tokens; the window group lost block 1, so its only
    # valid hit is block 0 alone, and full attention must stop there too.
    swa.block_pool.uncache_blocks([swa_blocks[1]])
    hits, num_hit = coordinator.find_longest_cache_hit(req.block_hashes, 12)
    assert num_hit == 4
    assert [[b.block_id for b in group] for group in hits] == [[1], [1]]


def test_hybrid_manager_shares_a_prefix_in_both_groups():
    manager = hybrid_manager(window=6)
    a = make_request("a", list(range(13)))
    manager.allocate_slots(a, 13)
    a.num_computed_tokens = 13
    b = make_request("b", list(range(12)) + [99])
    hit_blocks, num_hit = manager.get_computed_blocks(b)
    assert num_hit == 12
    # The window group needs only blocks 1 and 2 (tokens 4..11) of the hit.
    assert hit_blocks.get_block_ids() == ([1, 2, 3], [0, 2, 3])
    manager.allocate_slots(b, 1, num_hit, hit_blocks)
    assert manager.get_block_ids("b") == ([1, 2, 3, 5], [0, 2, 3, 5])
    manager.free(a)
    manager.free(b)
    pools = manager.coordinator.block_pools
    assert all(blk.ref_cnt == 0 for pool in pools for blk in pool.blocks)


@dataclass(frozen=True, kw_only=True)
class PluginFullSpec(FullAttentionSpec):
    """A plugin's spec subclass that registers no manager of its own."""


class PluginWindowManager(SlidingWindowManager):
    """A plugin's manager registered for its own spec."""


@dataclass(frozen=True, kw_only=True)
class PluginWindowSpec(SlidingWindowSpec):
    pass


def test_managers_come_from_the_spec_registry_by_mro():
    registry = builtin_registry()
    registry.register(PluginWindowSpec, PluginWindowManager, owner="acme")
    specs = {
        "layers.0.plugin_full": PluginFullSpec(
            block_size=BLOCK_SIZE, num_kv_heads=1, head_size=2, dtype=torch.float32
        ),
        "layers.1.plugin_window": PluginWindowSpec(
            block_size=BLOCK_SIZE,
            num_kv_heads=1,
            head_size=2,
            dtype=torch.float32,
            sliding_window=4,
        ),
    }
    coordinator = KVCacheCoordinator(kv_cache_config_for_blocks(specs, 4), True, registry)
    assert [type(m) for m in coordinator.managers] == [FullAttentionManager, PluginWindowManager]


def test_groups_with_different_block_sizes_are_refused():
    config = kv_cache_config_for_blocks({"a": full_spec(4), "b": full_spec(8)}, 4)
    with pytest.raises(ValueError, match=r"one block_size, got \[4, 8\]"):
        KVCacheCoordinator(config, True, builtin_registry())


def test_sliding_window_manager_rejects_other_specs():
    with pytest.raises(TypeError, match="SlidingWindowSpec"):
        SlidingWindowManager(full_spec(), BlockPool(4))
