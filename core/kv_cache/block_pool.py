"""BlockPool: the KV-cache blocks of one group, their ref counts and the prefix cache.

Every block is in exactly one of three states:
- in use: ref_cnt > 0, held by that many requests, not in the free queue;
- free and cached: ref_cnt == 0, in the free queue, still findable by its hash (its KV is
  intact until the block is handed out again);
- free and uncached: ref_cnt == 0, in the free queue, no hash.

The free queue is the eviction order. Cached blocks go to its tail when freed, so the
block handed out next is the one freed longest ago (LRU eviction). Uncached blocks go to
its head: they hold nothing worth keeping, so reusing them first spares cached blocks
from eviction, and the most recently freed memory is the most likely still in the CPU's
(or GPU's L2) cache (LIFO reuse). Block 0 is the null block: a placeholder in block
tables (e.g. positions a sliding window has left), never handed out, never freed.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from core.kv_cache.block_hash import BlockHash

if TYPE_CHECKING:
    from core.request import Request

__all__ = ["BlockPool", "FreeKVCacheBlockQueue", "KVCacheBlock"]


class KVCacheBlock:
    """One block id with its ref count, its hash when cached, and free-queue links."""

    __slots__ = ("block_id", "ref_cnt", "block_hash", "prev_free", "next_free", "is_null")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: BlockHash | None = None
        self.prev_free: KVCacheBlock | None = None
        self.next_free: KVCacheBlock | None = None
        self.is_null = False

    def __repr__(self) -> str:
        cached = "" if self.block_hash is None else ", cached"
        return f"KVCacheBlock({self.block_id}, ref_cnt={self.ref_cnt}{cached})"


class FreeKVCacheBlockQueue:
    """A doubly linked list of free blocks, head evicted first.

    Linked through the blocks themselves so that a cached block found by a prefix hit
    leaves the queue in O(1) from wherever it sits. Sentinel head and tail nodes keep
    every operation free of edge cases.
    """

    def __init__(self, blocks: Iterable[KVCacheBlock]) -> None:
        self._head = KVCacheBlock(-1)
        self._tail = KVCacheBlock(-1)
        self._head.next_free, self._tail.prev_free = self._tail, self._head
        self.num_free_blocks = 0
        for block in blocks:
            self.append(block)

    def __len__(self) -> int:
        return self.num_free_blocks

    def __iter__(self) -> Iterator[KVCacheBlock]:
        """Head to tail: the order in which blocks would be handed out."""
        node = self._head.next_free
        while node is not self._tail:
            yield node
            node = node.next_free

    def popleft(self) -> KVCacheBlock:
        if self.num_free_blocks == 0:
            raise ValueError("no free KV-cache block to pop")
        block = self._head.next_free
        self.remove(block)
        return block

    def remove(self, block: KVCacheBlock) -> None:
        if block.prev_free is None or block.next_free is None:
            raise ValueError(f"block {block.block_id} is not in the free queue")
        block.prev_free.next_free = block.next_free
        block.next_free.prev_free = block.prev_free
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        self._insert_after(self._tail.prev_free, block)

    def appendleft(self, block: KVCacheBlock) -> None:
        self._insert_after(self._head, block)

    def _insert_after(self, node: KVCacheBlock, block: KVCacheBlock) -> None:
        if block.prev_free is not None:
            raise ValueError(f"block {block.block_id} is already in the free queue")
        block.prev_free, block.next_free = node, node.next_free
        node.next_free.prev_free = block
        node.next_free = block
        self.num_free_blocks += 1


class BlockPool:
    """`num_blocks` blocks (block 0 the null block) and the hash -> block index.

    Ref counts are exact: `get_new_blocks` and `touch` add one per holder, `free_blocks`
    removes one; a block reaching 0 returns to the free queue. The null block is skipped
    by `touch` and `free_blocks`, so block lists holding it can be passed whole.
    """

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks < 2:
            raise ValueError(
                f"num_blocks must be >= 2 (block 0 is the null block), got {num_blocks}"
            )
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True
        # One block per hash: a second block with the same content stays uncached; the
        # first copy serves every hit.
        self._cached_blocks: dict[BlockHash, KVCacheBlock] = {}

    def get_num_free_blocks(self) -> int:
        return len(self.free_block_queue)

    def get_usage(self) -> float:
        """The fraction of usable blocks (all but the null block) held by requests."""
        return 1.0 - self.get_num_free_blocks() / (self.num_blocks - 1)

    def get_cached_block(self, block_hash: BlockHash) -> KVCacheBlock | None:
        return self._cached_blocks.get(block_hash)

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Take `num_blocks` blocks from the free queue head, evicting their cached hashes."""
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(
                f"cannot get {num_blocks} new blocks: only {self.get_num_free_blocks()} are free"
            )
        blocks = [self.free_block_queue.popleft() for _ in range(num_blocks)]
        for block in blocks:
            self._uncache(block)
            block.ref_cnt = 1
        return blocks

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Add a holder to each block (a prefix hit); a free block leaves the free queue."""
        for block in blocks:
            if block.is_null:
                continue
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop a holder from each block; blocks reaching 0 become free, in the given order.

        Callers pass a request's blocks last first, so among its cached blocks the tail
        of its sequence (the least shared part of a prefix) is evicted first.
        """
        for block in ordered_blocks:
            if block.is_null:
                continue
            if block.ref_cnt < 1:
                raise ValueError(f"block {block.block_id} freed more often than it was taken")
            block.ref_cnt -= 1
            if block.ref_cnt > 0:
                continue
            if block.block_hash is None:
                self.free_block_queue.appendleft(block)
            else:
                self.free_block_queue.append(block)

    def cache_full_blocks(
        self,
        request: Request,
        blocks: list[KVCacheBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
    ) -> None:
        """Index blocks[num_cached_blocks:num_full_blocks] by the request's block hashes.

        Null blocks and blocks already cached (prefix hits) are left as they are.
        """
        if not self.enable_caching:
            return
        if len(request.block_hashes) < num_full_blocks:
            raise ValueError(
                f"request {request.request_id} has {len(request.block_hashes)} block hashes, "
                f"{num_full_blocks} needed: was it built with a block hasher?"
            )
        for index in range(num_cached_blocks, num_full_blocks):
            block = blocks[index]
            block_hash = request.block_hashes[index]
            if block.is_null or block.block_hash is not None or block_hash in self._cached_blocks:
                continue
            block.block_hash = block_hash
            self._cached_blocks[block_hash] = block

    def uncache_blocks(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Forget the hashes of blocks whose KV was never written (see the manager's free)."""
        for block in blocks:
            self._uncache(block)

    def reset_prefix_cache(self) -> bool:
        """Forget every hash; refused (False) while any block is in use.

        A reset drops KV that is no longer valid (e.g. after a weight update). A running
        request would keep attending to its old blocks and index the new blocks it fills
        on top of them, so stale KV would leak back into the cache; callers retry once
        requests have drained.
        """
        if self.get_num_free_blocks() != self.num_blocks - 1:
            return False
        for block in self._cached_blocks.values():
            block.block_hash = None
        self._cached_blocks.clear()
        return True

    def _uncache(self, block: KVCacheBlock) -> None:
        if block.block_hash is None:
            return
        if self._cached_blocks.get(block.block_hash) is block:
            del self._cached_blocks[block.block_hash]
        block.block_hash = None
