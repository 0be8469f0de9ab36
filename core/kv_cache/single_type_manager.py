"""Per-spec KV-cache managers: the block list of every request in one KV-cache group.

A manager class is registered for a spec class in the KVCacheSpecRegistry (core's own in
`builtin_specs.py`; plugins through `core.kv_cache_specs`) and is constructed as
`manager_cls(spec, block_pool)`. What differs between kinds of attention is two things:
which cached blocks make a valid prefix hit, and which leading tokens no future token
reads (their blocks can go back to the pool). Everything else is shared here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING

from core.kv_cache.block_hash import BlockHash
from core.kv_cache.block_pool import BlockPool, KVCacheBlock
from core.kv_cache.spec import KVCacheSpec, SlidingWindowSpec

if TYPE_CHECKING:
    from core.request import Request

__all__ = ["FullAttentionManager", "SingleTypeKVCacheManager", "SlidingWindowManager"]


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class SingleTypeKVCacheManager(ABC):
    """The blocks each request holds in one group, and how a prefix hit is found.

    A request's block list covers its tokens from position 0; entry i holds tokens
    [i * block_size, (i + 1) * block_size). Entries a request no longer needs become the
    pool's null block, so positions never shift.
    """

    def __init__(self, spec: KVCacheSpec, block_pool: BlockPool) -> None:
        self.spec = spec
        self.block_size = spec.block_size
        self.block_pool = block_pool
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        # How many leading blocks of each request have gone through cache_full_blocks.
        self.num_cached_blocks: dict[str, int] = {}

    @abstractmethod
    def find_longest_cache_hit(
        self, block_hashes: Sequence[BlockHash], max_length: int
    ) -> list[KVCacheBlock]:
        """The blocks of the longest cached prefix of at most `max_length` tokens.

        Entries may be the null block where this kind of attention does not need the KV;
        `len(result) * block_size` is the hit length.
        """

    @abstractmethod
    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """How many leading tokens no token from `num_computed_tokens` on will read."""

    def get_blocks(self, request_id: str) -> list[KVCacheBlock]:
        return self.req_to_blocks.get(request_id, [])

    def get_num_blocks_to_allocate(
        self, request_id: str, num_tokens: int, new_computed_blocks: Sequence[KVCacheBlock]
    ) -> int:
        """Free blocks that covering `num_tokens` tokens would take from the pool.

        Prefix-hit blocks resting in the free queue count too: touching them takes them
        out of it just as an allocation would.
        """
        num_held = len(self.get_blocks(request_id)) + len(new_computed_blocks)
        num_new = max(cdiv(num_tokens, self.block_size) - num_held, 0)
        num_revived = sum(1 for b in new_computed_blocks if b.ref_cnt == 0 and not b.is_null)
        return num_new + num_revived

    def save_new_computed_blocks(
        self, request_id: str, new_computed_blocks: Sequence[KVCacheBlock]
    ) -> None:
        """Start a new request's block list with its prefix-hit blocks (already touched)."""
        if not new_computed_blocks:
            return
        if request_id in self.req_to_blocks:
            raise ValueError(
                f"request {request_id} already holds blocks; a prefix hit starts a list"
            )
        self.req_to_blocks[request_id] = list(new_computed_blocks)

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[KVCacheBlock]:
        """Extend the request's list to cover `num_tokens` tokens; return the new blocks."""
        blocks = self.req_to_blocks.setdefault(request_id, [])
        num_new = cdiv(num_tokens, self.block_size) - len(blocks)
        if num_new <= 0:
            return []
        new_blocks = self.block_pool.get_new_blocks(num_new)
        blocks.extend(new_blocks)
        return new_blocks

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Index the request's blocks that the first `num_tokens` tokens fill."""
        num_cached = self.num_cached_blocks.get(request.request_id, 0)
        num_full = num_tokens // self.block_size
        if num_full <= num_cached:
            return
        blocks = self.req_to_blocks[request.request_id]
        self.block_pool.cache_full_blocks(request, blocks, num_cached, num_full)
        self.num_cached_blocks[request.request_id] = num_full

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """Free the blocks holding only skipped tokens, leaving null blocks in their place."""
        blocks = self.get_blocks(request_id)
        num_skipped = self.get_num_skipped_tokens(num_computed_tokens) // self.block_size
        removed = []
        for index in reversed(range(min(num_skipped, len(blocks)))):
            if blocks[index].is_null:
                break  # an earlier call already freed this block and everything before it
            removed.append(blocks[index])
            blocks[index] = self.block_pool.null_block
        self.block_pool.free_blocks(removed)

    def free(self, request_id: str, num_computed_tokens: int) -> None:
        """Give back every block of the request, last block first.

        Blocks are cached when allocated, before the step that writes their KV runs. If
        the request leaves before that step (preempted in the step that scheduled it),
        the blocks past `num_computed_tokens` are indexed but empty: forget their hashes
        so no other request can hit them.
        """
        blocks = self.req_to_blocks.pop(request_id, [])
        num_cached = self.num_cached_blocks.pop(request_id, 0)
        self.block_pool.uncache_blocks(blocks[num_computed_tokens // self.block_size : num_cached])
        self.block_pool.free_blocks(reversed(blocks))


class FullAttentionManager(SingleTypeKVCacheManager):
    """Attention over the whole context: a hit is the longest run of cached leading blocks."""

    def find_longest_cache_hit(
        self, block_hashes: Sequence[BlockHash], max_length: int
    ) -> list[KVCacheBlock]:
        hits = []
        for block_hash in block_hashes[: max_length // self.block_size]:
            block = self.block_pool.get_cached_block(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return 0


class SlidingWindowManager(SingleTypeKVCacheManager):
    """Attention over the last `sliding_window` tokens (a token and the window - 1 before it).

    A hit of length L only needs the KV of tokens [L - window + 1, L): the cached blocks
    covering them, with null blocks before. Blocks wholly before the window of the next
    token to compute are freed as the request advances.
    """

    def __init__(self, spec: KVCacheSpec, block_pool: BlockPool) -> None:
        if not isinstance(spec, SlidingWindowSpec):
            raise TypeError(f"SlidingWindowManager needs a SlidingWindowSpec, got {type(spec)}")
        if spec.sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1, got {spec.sliding_window}")
        super().__init__(spec, block_pool)
        self.sliding_window = spec.sliding_window
        # Cached blocks needed right before a block-aligned hit end.
        self._num_window_blocks = cdiv(spec.sliding_window - 1, spec.block_size)

    def find_longest_cache_hit(
        self, block_hashes: Sequence[BlockHash], max_length: int
    ) -> list[KVCacheBlock]:
        # Scan from the right for the last run of enough consecutive cached blocks.
        num_blocks = min(max_length // self.block_size, len(block_hashes))
        hits = [self.block_pool.null_block] * num_blocks
        run = 0
        for index in reversed(range(num_blocks)):
            block = self.block_pool.get_cached_block(block_hashes[index])
            if block is None:
                run = 0
                continue
            hits[index] = block
            run += 1
            if run == self._num_window_blocks:
                return hits[: index + run]
        # A shorter run that reaches block 0 is a hit too: nothing precedes it.
        return hits[:run]

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return max(num_computed_tokens - self.sliding_window + 1, 0)
