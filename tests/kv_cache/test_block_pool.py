"""BlockPool: the null block, exact ref counts, LIFO reuse of uncached and LRU eviction."""

from __future__ import annotations

import pytest

from core.kv_cache.block_hash import make_block_hasher
from core.kv_cache.block_pool import BlockPool, FreeKVCacheBlockQueue, KVCacheBlock
from core.request import Request
from core.sampling_params import SamplingParams

BLOCK_SIZE = 4


def request(request_id: str, tokens: list[int]) -> Request:
    hasher = make_block_hasher(BLOCK_SIZE)
    return Request(request_id, tokens, SamplingParams(), None, 0.0, block_hasher=hasher)


def free_ids(pool: BlockPool) -> list[int]:
    return [block.block_id for block in pool.free_block_queue]


def take_cached(pool: BlockPool, req: Request) -> list[KVCacheBlock]:
    """Blocks for all of the request's full blocks, indexed by its hashes."""
    blocks = pool.get_new_blocks(len(req.block_hashes))
    pool.cache_full_blocks(req, blocks, 0, len(blocks))
    return blocks


def test_block_0_is_the_null_block_and_is_never_handed_out():
    pool = BlockPool(5)
    assert pool.null_block is pool.blocks[0] and pool.null_block.is_null
    assert [b.block_id for b in pool.get_new_blocks(4)] == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="only 0 are free"):
        pool.get_new_blocks(1)
    pool.touch([pool.null_block])
    pool.free_blocks([pool.null_block])
    assert pool.null_block.ref_cnt == 0 and pool.get_num_free_blocks() == 0


def test_free_queue_starts_in_block_id_order_without_the_null_block():
    pool = BlockPool(5)
    assert free_ids(pool) == [1, 2, 3, 4]
    assert pool.get_num_free_blocks() == 4 and pool.get_usage() == 0.0


def test_uncached_blocks_are_reused_first_and_cached_ones_evicted_tail_first():
    pool = BlockPool(6)
    req = request("a", list(range(10)))  # two full blocks and a partial one
    blocks = take_cached(pool, req) + pool.get_new_blocks(1)
    assert [b.block_id for b in blocks] == [1, 2, 3]
    pool.free_blocks(reversed(blocks))
    # Uncached 3 goes to the head; cached 2 then 1 to the tail.
    assert free_ids(pool) == [3, 4, 5, 2, 1]
    assert [b.block_id for b in pool.get_new_blocks(4)] == [3, 4, 5, 2]
    assert pool.get_cached_block(req.block_hashes[1]) is None  # evicted on reuse
    assert pool.blocks[2].block_hash is None
    assert pool.get_cached_block(req.block_hashes[0]) is pool.blocks[1]


def test_cached_blocks_are_evicted_least_recently_used_first():
    pool = BlockPool(5)
    a = take_cached(pool, request("a", list(range(8))))
    b = take_cached(pool, request("b", list(range(100, 108))))
    pool.free_blocks(reversed(a))
    pool.free_blocks(reversed(b))
    assert free_ids(pool) == [2, 1, 4, 3]
    # A prefix hit on block 1 takes it out of the queue; freed again it is the newest.
    pool.touch([a[0]])
    assert free_ids(pool) == [2, 4, 3] and a[0].ref_cnt == 1
    pool.free_blocks([a[0]])
    assert free_ids(pool) == [2, 4, 3, 1]
    assert [blk.block_id for blk in pool.get_new_blocks(3)] == [2, 4, 3]


def test_ref_counts_are_exact_for_shared_blocks():
    pool = BlockPool(4)
    (block,) = pool.get_new_blocks(1)
    pool.touch([block])  # a second request shares it
    assert block.ref_cnt == 2 and pool.get_num_free_blocks() == 2
    pool.free_blocks([block])
    assert block.ref_cnt == 1 and block.block_id not in free_ids(pool)
    pool.free_blocks([block])
    assert block.ref_cnt == 0 and free_ids(pool) == [1, 2, 3]
    with pytest.raises(ValueError, match="block 1 freed more often"):
        pool.free_blocks([block])


def test_a_second_block_with_a_cached_hash_stays_uncached():
    pool = BlockPool(5)
    first = take_cached(pool, request("a", [1, 2, 3, 4]))
    second = take_cached(pool, request("b", [1, 2, 3, 4]))
    assert first[0].block_hash is not None and second[0].block_hash is None
    pool.free_blocks(second)
    assert free_ids(pool)[0] == second[0].block_id  # uncached: reused first


def test_reset_prefix_cache_is_refused_while_blocks_are_in_use():
    pool = BlockPool(4)
    req = request("a", list(range(8)))
    blocks = take_cached(pool, req)
    assert pool.reset_prefix_cache() is False
    assert pool.get_cached_block(req.block_hashes[0]) is blocks[0]
    pool.free_blocks(reversed(blocks))
    assert pool.reset_prefix_cache() is True
    assert pool.get_cached_block(req.block_hashes[0]) is None
    assert all(b.block_hash is None for b in pool.blocks)


def test_caching_disabled_indexes_nothing():
    pool = BlockPool(4, enable_caching=False)
    req = request("a", list(range(8)))
    blocks = take_cached(pool, req)
    assert all(b.block_hash is None for b in blocks)
    assert pool.get_cached_block(req.block_hashes[0]) is None


def test_usage_counts_blocks_held_out_of_the_usable_ones():
    pool = BlockPool(5)
    pool.get_new_blocks(3)
    assert pool.get_usage() == 0.75


def test_free_queue_removes_from_the_middle_and_rejects_double_insertion():
    blocks = [KVCacheBlock(i) for i in range(4)]
    queue = FreeKVCacheBlockQueue(blocks)
    queue.remove(blocks[2])
    assert [b.block_id for b in queue] == [0, 1, 3] and len(queue) == 3
    with pytest.raises(ValueError, match="not in the free queue"):
        queue.remove(blocks[2])
    with pytest.raises(ValueError, match="already in the free queue"):
        queue.append(blocks[1])
    queue.appendleft(blocks[2])
    assert [b.block_id for b in queue] == [2, 0, 1, 3]
    assert [queue.popleft().block_id for _ in range(4)] == [2, 0, 1, 3]
    with pytest.raises(ValueError, match="no free"):
        queue.popleft()
