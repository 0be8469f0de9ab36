"""KVCacheManager: the scheduler's one door to the paged KV cache and the prefix cache.

The scheduler asks two questions of it: how much of a new request is already cached
(`get_computed_blocks`) and whether a request can get slots for its next tokens
(`allocate_slots`, None meaning "not now": preempt something or wait). Block ids leave
it per KV-cache group, as `tuple[list[int], ...]`.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.kv_cache.block_hash import HashAlgo, make_block_hasher
from core.kv_cache.block_pool import KVCacheBlock
from core.kv_cache.coordinator import KVCacheCoordinator
from core.kv_cache.layout import KVCacheConfig
from core.kv_cache.registry import KVCacheSpecRegistry, load_spec_registry
from core.request import Request, RequestStatus

__all__ = ["KVCacheBlocks", "KVCacheManager", "PrefixCacheStats"]

# Statuses of a request being admitted, the only ones the watermark holds back.
_ADMITTED_STATUSES = (RequestStatus.WAITING, RequestStatus.PREEMPTED)


@dataclass(frozen=True)
class KVCacheBlocks:
    """Blocks per KV-cache group, the manager's answer to the scheduler.

    Groups are the outer dimension, not blocks: groups need not hold the same number of
    blocks (a sliding-window group may later use fewer or differently sized blocks).
    """

    blocks: tuple[list[KVCacheBlock], ...]

    def get_block_ids(self) -> tuple[list[int], ...]:
        return tuple([block.block_id for block in group] for group in self.blocks)


@dataclass
class PrefixCacheStats:
    """Cumulative prefix-cache lookups, in tokens: hit rate = hits / queries."""

    requests: int = 0
    queries: int = 0
    hits: int = 0


class KVCacheManager:
    """Allocates KV-cache blocks to requests and shares cached prefixes between them.

    `watermark` is the fraction of blocks a request being admitted must leave free while
    other requests hold blocks, so that running requests can grow for a while before
    anything is preempted. `block_hasher` (None without caching) is what requests must be
    built with (`Request.from_engine_core_request(req, manager.block_hasher)`).
    """

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        max_model_len: int,
        enable_caching: bool = True,
        hash_algo: HashAlgo = "sha256",
        spec_registry: KVCacheSpecRegistry | None = None,
        watermark: float = 0.01,
    ) -> None:
        if not 0.0 <= watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {watermark}")
        if max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {max_model_len}")
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.coordinator = KVCacheCoordinator(
            kv_cache_config, enable_caching, spec_registry or load_spec_registry()
        )
        self.block_size = self.coordinator.block_size
        self.block_hasher = (
            make_block_hasher(self.block_size, hash_algo) if enable_caching else None
        )
        self.watermark_blocks = int(watermark * (kv_cache_config.num_blocks - 1))
        self.prefix_cache_stats = PrefixCacheStats()

    @property
    def usage(self) -> float:
        """The fraction of blocks in use in the fullest group (the one that preempts first)."""
        return max(pool.get_usage() for pool in self.coordinator.block_pools)

    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int]:
        """The cached blocks of the request's longest cached prefix and its length in tokens.

        The hit stops short of the last token: the forward pass over it is what produces
        the logits of the next token, so it is always computed. Requests asking for
        prompt logprobs get no hit: they need the logits of every prompt position.
        """
        params = request.sampling_params  # None for a pooled request: no logprobs
        if not self.enable_caching or params is not None and params.prompt_logprobs is not None:
            return KVCacheBlocks(self.coordinator.empty_blocks()), 0
        blocks, num_hit_tokens = self.coordinator.find_longest_cache_hit(
            request.block_hashes, request.num_tokens - 1
        )
        self.prefix_cache_stats.requests += 1
        self.prefix_cache_stats.queries += request.num_tokens
        self.prefix_cache_stats.hits += num_hit_tokens
        return KVCacheBlocks(blocks), num_hit_tokens

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        cache_external: bool = True,
    ) -> KVCacheBlocks | None:
        """Give the request slots for its next tokens; None if they don't fit.

        On None the request holds the blocks it held (less any a sliding window had
        already left behind) and no ref count changed: the scheduler may preempt and retry.

        The request's tokens, left to right:

            | computed | new computed | external computed | new | lookahead |
                                                          |< to compute >|
                       |<---------------- to be allocated ----------------->|

        computed: KV already in the request's blocks (request.num_computed_tokens);
        new computed: a prefix-cache hit (`new_computed_blocks`, from get_computed_blocks);
        external computed: KV a connector will load; new: computed this step; lookahead:
        slots for speculative tokens. Returns only the newly allocated blocks per group.

        Blocks full of computed, external and new tokens are indexed in the prefix cache
        now, before the step writes them. That is safe because an attention backend
        writes the KV of the whole batch before any request of it reads the cache, and
        because `free` unindexes blocks that a step never wrote. External tokens that
        load asynchronously (`cache_external` False) are indexed by `cache_blocks` once
        they have loaded, not now: no other request may read a block before it is written.
        """
        _check_counts(
            num_new_tokens,
            num_new_computed_tokens,
            num_lookahead_tokens,
            num_external_computed_tokens,
        )
        request_id = request.request_id
        new_computed = (
            self.coordinator.empty_blocks()
            if new_computed_blocks is None
            else new_computed_blocks.blocks
        )
        # Blocks that left the window go back first, so they count as free below.
        self.coordinator.remove_skipped_blocks(request_id, request.num_computed_tokens)
        num_computed = request.num_computed_tokens + num_new_computed_tokens
        num_to_compute = num_computed + num_external_computed_tokens + num_new_tokens
        num_with_slots = min(num_to_compute + num_lookahead_tokens, self.max_model_len)
        if not self.coordinator.can_allocate(
            request_id, num_with_slots, new_computed, self._num_reserved_blocks(request)
        ):
            return None
        self.coordinator.save_new_computed_blocks(request_id, new_computed)
        new_blocks = self.coordinator.allocate_new_blocks(request_id, num_with_slots)
        # Lookahead slots hold draft tokens that may be rejected: never cached.
        num_cached = num_to_compute if cache_external else num_computed
        self.coordinator.cache_blocks(request, min(num_cached, request.num_tokens))
        return KVCacheBlocks(new_blocks)

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Index the request's blocks full within its first `num_tokens` tokens in the
        prefix cache (those an asynchronous load has just written)."""
        self.coordinator.cache_blocks(request, min(num_tokens, request.num_tokens))

    def free(self, request: Request) -> None:
        """Give back all of the request's blocks (finished, aborted or preempted).

        Call it while `request.num_computed_tokens` still counts the tokens whose KV
        executed steps wrote (before a preemption resets it): blocks past that point
        lose their prefix-cache entry.
        """
        self.coordinator.free(request.request_id, request.num_computed_tokens)

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return KVCacheBlocks(self.coordinator.get_blocks(request_id))

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """Every block id the request holds, per group (null blocks as id 0)."""
        return self.get_blocks(request_id).get_block_ids()

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix; False (nothing forgotten) while requests hold blocks."""
        return self.coordinator.reset_prefix_cache()

    def _num_reserved_blocks(self, request: Request) -> int:
        # With nothing else holding blocks the watermark protects no one, and a request
        # needing every block could never start.
        if request.status not in _ADMITTED_STATUSES:
            return 0
        if self.coordinator.num_requests_holding_blocks() == 0:
            return 0
        return self.watermark_blocks


def _check_counts(
    num_new_tokens: int, num_new_computed_tokens: int, num_lookahead_tokens: int, num_external: int
) -> None:
    counts = {
        "num_new_tokens": num_new_tokens,
        "num_new_computed_tokens": num_new_computed_tokens,
        "num_lookahead_tokens": num_lookahead_tokens,
        "num_external_computed_tokens": num_external,
    }
    for name, value in counts.items():
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    if num_new_tokens == 0 and num_external == 0:
        raise ValueError("allocate_slots needs num_new_tokens or num_external_computed_tokens > 0")
