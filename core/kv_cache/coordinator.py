"""KVCacheCoordinator: one manager per KV-cache group, one prefix hit valid for all.

Each group has its own BlockPool of `num_blocks` blocks because each group has its own
KVCacheTensor of `num_blocks` pages (`grouping.kv_cache_config_for_blocks`): block id b
of two groups names two different pages, so the groups' id spaces are independent.
Block ids therefore always travel per group, `tuple[list[int], ...]`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from core.kv_cache.block_hash import BlockHash
from core.kv_cache.block_pool import BlockPool, KVCacheBlock
from core.kv_cache.layout import KVCacheConfig
from core.kv_cache.registry import KVCacheSpecRegistry
from core.kv_cache.single_type_manager import SingleTypeKVCacheManager

if TYPE_CHECKING:
    from core.request import Request

__all__ = ["GroupBlocks", "KVCacheCoordinator"]

# One block list per KV-cache group, in the config's group order.
GroupBlocks = tuple[list[KVCacheBlock], ...]


class KVCacheCoordinator:
    """Runs the per-group managers in step; every method acts on all groups.

    All groups must share one block size: block hashes are computed once per request at
    that size, and a hit length must be a whole number of blocks in every group.
    """

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        enable_caching: bool,
        spec_registry: KVCacheSpecRegistry,
    ) -> None:
        groups = kv_cache_config.kv_cache_groups
        if not groups:
            raise ValueError("kv_cache_config has no KV-cache groups")
        block_sizes = sorted({group.kv_cache_spec.block_size for group in groups})
        if len(block_sizes) != 1:
            raise ValueError(f"all KV-cache groups must share one block_size, got {block_sizes}")
        self.block_size = block_sizes[0]
        self.managers: tuple[SingleTypeKVCacheManager, ...] = tuple(
            spec_registry.manager_for(type(group.kv_cache_spec))(
                group.kv_cache_spec, BlockPool(kv_cache_config.num_blocks, enable_caching)
            )
            for group in groups
        )

    @property
    def block_pools(self) -> tuple[BlockPool, ...]:
        return tuple(manager.block_pool for manager in self.managers)

    def empty_blocks(self) -> GroupBlocks:
        return tuple([] for _ in self.managers)

    def get_blocks(self, request_id: str) -> GroupBlocks:
        return tuple(manager.get_blocks(request_id) for manager in self.managers)

    def num_requests_holding_blocks(self) -> int:
        return len(set().union(*(manager.req_to_blocks for manager in self.managers)))

    def find_longest_cache_hit(
        self, block_hashes: Sequence[BlockHash], max_length: int
    ) -> tuple[GroupBlocks, int]:
        """The hit blocks per group and the longest hit length every group accepts.

        Each group may accept less than the length asked (a full-attention group stops
        at its first miss, a sliding-window group needs the blocks before the end), so
        the length shrinks until all groups return it; it only decreases, so this ends.
        """
        hit_length = max_length
        while True:
            hits = tuple(m.find_longest_cache_hit(block_hashes, hit_length) for m in self.managers)
            lengths = {len(blocks) * self.block_size for blocks in hits}
            if len(lengths) == 1:
                return hits, lengths.pop()
            hit_length = min(lengths)

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        for manager in self.managers:
            manager.remove_skipped_blocks(request_id, num_computed_tokens)

    def can_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: GroupBlocks,
        num_reserved_blocks: int,
    ) -> bool:
        """Whether every group can cover `num_tokens` and keep `num_reserved_blocks` free."""
        return all(
            manager.get_num_blocks_to_allocate(request_id, num_tokens, blocks)
            <= manager.block_pool.get_num_free_blocks() - num_reserved_blocks
            for manager, blocks in zip(self.managers, new_computed_blocks, strict=True)
        )

    def save_new_computed_blocks(self, request_id: str, new_computed_blocks: GroupBlocks) -> None:
        """Start the request's lists with its prefix-hit blocks and touch them."""
        for manager, blocks in zip(self.managers, new_computed_blocks, strict=True):
            # A request holding blocks holds them in every group: the first group raises
            # before anything is touched.
            manager.save_new_computed_blocks(request_id, blocks)
            manager.block_pool.touch(blocks)

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> GroupBlocks:
        return tuple(
            manager.allocate_new_blocks(request_id, num_tokens) for manager in self.managers
        )

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        for manager in self.managers:
            manager.cache_blocks(request, num_tokens)

    def free(self, request_id: str, num_computed_tokens: int) -> None:
        for manager in self.managers:
            manager.free(request_id, num_computed_tokens)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash in every group; refused while any block is in use."""
        pools = self.block_pools
        if any(pool.get_num_free_blocks() != pool.num_blocks - 1 for pool in pools):
            return False
        return all([pool.reset_prefix_cache() for pool in pools])
