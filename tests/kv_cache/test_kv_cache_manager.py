"""KVCacheManager: prefix sharing, the num_tokens - 1 cap, no leaks, admission control."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from core.kv_cache import builtin_specs
from core.kv_cache.grouping import kv_cache_config_for_blocks
from core.kv_cache.kv_cache_manager import KVCacheManager
from core.kv_cache.registry import KVCacheSpecRegistry
from core.kv_cache.spec import FullAttentionSpec, SlidingWindowSpec
from core.lora.request import LoRARequest
from core.request import Request, RequestStatus
from core.sampling_params import SamplingParams

BLOCK_SIZE = 4
PREFIX = list(range(100, 108))  # two full blocks


def make_manager(num_blocks: int = 11, watermark: float = 0.0, **kwargs) -> KVCacheManager:
    spec = FullAttentionSpec(
        block_size=BLOCK_SIZE, num_kv_heads=1, head_size=2, dtype=torch.float32
    )
    registry = KVCacheSpecRegistry()
    builtin_specs.register(registry)
    config = kv_cache_config_for_blocks({"layers.0.attn": spec}, num_blocks)
    return KVCacheManager(
        config, max_model_len=64, spec_registry=registry, watermark=watermark, **kwargs
    )


def make_request(manager, request_id, tokens, prompt_logprobs=None, **kwargs) -> Request:
    params = SamplingParams(prompt_logprobs=prompt_logprobs)
    return Request(
        request_id, tokens, params, None, 0.0, block_hasher=manager.block_hasher, **kwargs
    )


def admit(manager: KVCacheManager, req: Request) -> list[int] | None:
    """The scheduler's waiting path: look up the prefix, allocate, compute the prompt."""
    hit_blocks, num_hit = manager.get_computed_blocks(req)
    new = manager.allocate_slots(req, req.num_tokens - num_hit, num_hit, hit_blocks)
    if new is None:
        return None
    req.status = RequestStatus.RUNNING
    req.num_computed_tokens = req.num_tokens
    req.num_cached_tokens = num_hit
    return manager.get_block_ids(req.request_id)[0]


def decode(manager: KVCacheManager, req: Request, token: int) -> None:
    """The scheduler's running path for one sampled token."""
    req.append_output_token_ids(token)
    assert manager.allocate_slots(req, 1) is not None
    req.num_computed_tokens += 1


def pool(manager: KVCacheManager):
    (block_pool,) = manager.coordinator.block_pools
    return block_pool


def ref_counts(manager: KVCacheManager) -> list[int]:
    return [block.ref_cnt for block in pool(manager).blocks]


def assert_everything_free(manager: KVCacheManager) -> None:
    block_pool = pool(manager)
    assert all(count == 0 for count in ref_counts(manager))
    assert sorted(b.block_id for b in block_pool.free_block_queue) == list(range(1, 11))


def test_second_request_computes_only_its_suffix_on_shared_blocks():
    manager = make_manager()
    a = make_request(manager, "a", PREFIX + [1, 2])
    assert admit(manager, a) == [1, 2, 3]
    b = make_request(manager, "b", PREFIX + [7, 8, 9])
    hit_blocks, num_hit = manager.get_computed_blocks(b)
    assert hit_blocks.get_block_ids() == ([1, 2],) and num_hit == 8
    new = manager.allocate_slots(b, 3, num_hit, hit_blocks)
    assert new.get_block_ids() == ([4],)
    assert manager.get_block_ids("b") == ([1, 2, 4],)
    assert ref_counts(manager)[:5] == [0, 2, 2, 1, 1]
    stats = manager.prefix_cache_stats
    assert (stats.requests, stats.queries, stats.hits) == (2, 10 + 11, 8)


def test_an_entirely_cached_prompt_still_computes_its_last_token():
    manager = make_manager()
    admit(manager, make_request(manager, "a", PREFIX))
    same = make_request(manager, "b", PREFIX)
    # The hit is capped at 7 tokens, so one block: the last block is recomputed.
    assert manager.get_computed_blocks(same)[1] == 4
    longer = make_request(manager, "c", PREFIX + [5])
    assert manager.get_computed_blocks(longer)[1] == 8


def test_no_block_leaks_after_every_request_is_freed():
    manager = make_manager()
    a = make_request(manager, "a", PREFIX + [1, 2])
    b = make_request(manager, "b", PREFIX + [3])
    admit(manager, a)
    admit(manager, b)
    for token in range(5):
        decode(manager, a, token)
    manager.free(a)
    manager.free(b)
    assert_everything_free(manager)


def test_preempted_request_frees_and_resumes_from_its_own_cached_blocks():
    manager = make_manager()
    a = make_request(manager, "a", PREFIX + [1, 2])
    admit(manager, a)
    decode(manager, a, 3)
    blocks_before = manager.get_block_ids("a")[0]
    # Preemption as the scheduler does it: free while num_computed_tokens is still true.
    manager.free(a)
    a.status, a.num_computed_tokens = RequestStatus.PREEMPTED, 0
    assert_everything_free(manager)
    hit_blocks, num_hit = manager.get_computed_blocks(a)
    assert num_hit == 8 and hit_blocks.get_block_ids() == ([1, 2],)
    assert admit(manager, a)[:2] == blocks_before[:2]
    manager.free(a)
    assert_everything_free(manager)


def test_blocks_of_a_request_freed_before_its_step_ran_are_not_hits():
    manager = make_manager()
    a = make_request(manager, "a", PREFIX + [1])
    assert manager.allocate_slots(a, a.num_tokens) is not None
    # Preempted in the step that scheduled it: nothing was computed.
    manager.free(a)
    assert manager.get_computed_blocks(make_request(manager, "b", PREFIX + [1]))[1] == 0
    assert_everything_free(manager)


def test_different_cache_salts_never_share_blocks():
    manager = make_manager()
    admit(manager, make_request(manager, "a", PREFIX + [1], cache_salt="alice"))
    bob = make_request(manager, "b", PREFIX + [1], cache_salt="bob")
    alice = make_request(manager, "c", PREFIX + [1], cache_salt="alice")
    unsalted = make_request(manager, "d", PREFIX + [1])
    assert manager.get_computed_blocks(bob)[1] == 0
    assert manager.get_computed_blocks(unsalted)[1] == 0
    assert manager.get_computed_blocks(alice)[1] == 8


def test_lora_name_separates_prefixes():
    manager = make_manager()
    sql, chat = LoRARequest("sql", 1, "/adapters/sql"), LoRARequest("chat", 2, "/adapters/chat")
    admit(manager, make_request(manager, "a", PREFIX + [1], lora_request=sql))
    other = make_request(manager, "b", PREFIX + [1], lora_request=chat)
    base = make_request(manager, "c", PREFIX + [1])
    same = make_request(manager, "d", PREFIX + [1], lora_request=sql)
    assert manager.get_computed_blocks(other)[1] == 0
    assert manager.get_computed_blocks(base)[1] == 0
    assert manager.get_computed_blocks(same)[1] == 8


def test_prompt_logprobs_requests_skip_the_prefix_cache():
    manager = make_manager()
    admit(manager, make_request(manager, "a", PREFIX + [1]))
    wants_logprobs = make_request(manager, "b", PREFIX + [1], prompt_logprobs=1)
    hit_blocks, num_hit = manager.get_computed_blocks(wants_logprobs)
    assert hit_blocks.get_block_ids() == ([],) and num_hit == 0


def test_caching_disabled_means_no_hashes_and_no_hits():
    manager = make_manager(enable_caching=False)
    assert manager.block_hasher is None
    admit(manager, make_request(manager, "a", PREFIX + [1]))
    b = make_request(manager, "b", PREFIX + [1])
    assert b.block_hashes == [] and manager.get_computed_blocks(b)[1] == 0


def test_allocation_that_does_not_fit_returns_none_and_changes_nothing():
    manager = make_manager(num_blocks=5)
    a = make_request(manager, "a", PREFIX)
    admit(manager, a)
    manager.free(a)  # blocks 2, 1 cached at the tail of the queue
    b = make_request(manager, "b", PREFIX + list(range(12)))  # 20 tokens: 5 blocks
    hit_blocks, num_hit = manager.get_computed_blocks(b)
    assert num_hit == 8
    queue_before = [blk.block_id for blk in pool(manager).free_block_queue]
    assert manager.allocate_slots(b, 12, num_hit, hit_blocks) is None
    assert manager.get_block_ids("b") == ([],)
    assert ref_counts(manager) == [0, 0, 0, 0, 0]
    assert [blk.block_id for blk in pool(manager).free_block_queue] == queue_before
    assert manager.get_computed_blocks(b)[1] == 8


def test_watermark_holds_back_new_requests_but_not_running_ones():
    manager = make_manager(watermark=0.2)  # 2 of 10 usable blocks
    running = make_request(manager, "a", [1, 2, 3, 4, 5])
    admit(manager, running)  # holds 2 blocks, 8 free
    too_big = make_request(manager, "b", list(range(200, 228)))  # 7 blocks
    assert manager.allocate_slots(too_big, too_big.num_tokens) is None
    fits = make_request(manager, "c", list(range(300, 324)))  # 6 blocks
    assert manager.allocate_slots(fits, fits.num_tokens) is not None
    # A running request may dig into the reserve.
    assert manager.allocate_slots(running, 8) is not None
    assert pool(manager).get_num_free_blocks() == 0


def test_watermark_does_not_apply_when_nothing_else_holds_blocks():
    manager = make_manager(watermark=0.2)
    whole_cache = make_request(manager, "a", list(range(40)))  # all 10 usable blocks
    assert manager.allocate_slots(whole_cache, 40) is not None
    assert manager.usage == 1.0


def test_lookahead_slots_are_allocated_but_never_cached():
    manager = make_manager()
    a = make_request(manager, "a", PREFIX[:6])
    new = manager.allocate_slots(a, 6, num_lookahead_tokens=6)
    assert new.get_block_ids() == ([1, 2, 3],)
    assert [pool(manager).blocks[i].block_hash is not None for i in (1, 2, 3)] == [
        True,
        False,
        False,
    ]


def test_slots_stop_at_max_model_len():
    manager = make_manager(num_blocks=20)
    a = make_request(manager, "a", list(range(60)))
    new = manager.allocate_slots(a, 60, num_lookahead_tokens=10)
    assert len(new.get_block_ids()[0]) == 64 // BLOCK_SIZE


def test_generated_tokens_are_cached_as_their_blocks_fill():
    manager = make_manager()
    a = make_request(manager, "a", PREFIX[:6])
    admit(manager, a)
    for token in (7, 8, 9):
        decode(manager, a, token)
    follow_up = make_request(manager, "b", a.all_token_ids + [1])
    assert manager.get_computed_blocks(follow_up)[1] == 8


def test_reset_prefix_cache_waits_for_requests_to_drain():
    manager = make_manager()
    a = make_request(manager, "a", PREFIX + [1])
    admit(manager, a)
    assert manager.reset_prefix_cache() is False
    manager.free(a)
    assert manager.reset_prefix_cache() is True
    assert manager.get_computed_blocks(make_request(manager, "b", PREFIX + [1]))[1] == 0


def test_bad_allocation_arguments_are_value_errors():
    manager = make_manager()
    a = make_request(manager, "a", PREFIX)
    with pytest.raises(ValueError, match="num_new_tokens must be >= 0"):
        manager.allocate_slots(a, -1)
    with pytest.raises(ValueError, match="needs num_new_tokens"):
        manager.allocate_slots(a, 0)
    with pytest.raises(ValueError, match="watermark"):
        make_manager(watermark=1.0)


class _Simulation:
    """A random scheduler over a hybrid manager that records what KV each block holds."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        spec = dict(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=2, dtype=torch.float32)
        specs = {"layers.0.full": FullAttentionSpec(**spec)}
        if seed % 2:
            window = self.rng.randint(1, 9)
            specs["layers.1.swa"] = SlidingWindowSpec(**spec, sliding_window=window)
        registry = KVCacheSpecRegistry()
        builtin_specs.register(registry)
        config = kv_cache_config_for_blocks(specs, self.rng.randint(8, 20))
        self.manager = KVCacheManager(config, 64, spec_registry=registry, watermark=0.1)
        # written[group][block_id]: the token prefix whose KV the block holds, when full.
        self.written: list[dict[int, tuple[int, ...]]] = [{} for _ in specs]
        self.prefixes = [self.tokens(1, 12) for _ in range(3)]
        self.running: list[Request] = []
        self.waiting: list[Request] = []

    def tokens(self, low: int, high: int) -> list[int]:
        return [self.rng.randrange(5) for _ in range(self.rng.randint(low, high))]

    def step(self, index: int) -> None:
        if self.rng.random() < 0.4:
            prompt = self.rng.choice(self.prefixes) + self.tokens(0, 6)
            self.waiting.append(make_request(self.manager, f"r{index}", prompt))
        for req in list(self.running):
            self.step_running(req)
        for req in list(self.waiting):
            if not self.admit(req):
                break

    def step_running(self, req: Request) -> None:
        for _ in range(self.rng.randint(0, 2)):
            req.append_output_token_ids(self.rng.randrange(5))
        if req.num_tokens > 60:
            self.manager.free(req)
            self.running.remove(req)
            return
        num_new = req.num_tokens - req.num_computed_tokens
        lookahead = self.rng.randint(0, 2)
        if self.manager.allocate_slots(req, num_new, num_lookahead_tokens=lookahead) is None:
            self.preempt(req)
        elif self.rng.random() < 0.1:
            self.preempt(req)  # preempted in the very step that scheduled it
        else:
            self.compute(req)

    def admit(self, req: Request) -> bool:
        hit_blocks, num_hit = self.manager.get_computed_blocks(req)
        assert num_hit < req.num_tokens and num_hit % BLOCK_SIZE == 0
        for group, blocks in enumerate(hit_blocks.blocks):
            for i, block in enumerate(blocks):
                if not block.is_null:
                    prefix = tuple(req.all_token_ids[: (i + 1) * BLOCK_SIZE])
                    assert self.written[group].get(block.block_id) == prefix
        num_new = req.num_tokens - num_hit
        if self.manager.allocate_slots(req, num_new, num_hit, hit_blocks) is None:
            return False
        self.waiting.remove(req)
        self.running.append(req)
        req.status = RequestStatus.RUNNING
        self.compute(req)
        return True

    def compute(self, req: Request) -> None:
        """The step runs: every full block of the request now holds its prefix's KV."""
        for group, blocks in enumerate(self.manager.get_blocks(req.request_id).blocks):
            for i, block in enumerate(blocks[: req.num_tokens // BLOCK_SIZE]):
                if not block.is_null:
                    self.written[group][block.block_id] = tuple(
                        req.all_token_ids[: (i + 1) * BLOCK_SIZE]
                    )
        req.num_computed_tokens = req.num_tokens
        req.append_output_token_ids(self.rng.randrange(5))

    def preempt(self, req: Request) -> None:
        self.manager.free(req)
        req.status, req.num_computed_tokens = RequestStatus.PREEMPTED, 0
        self.running.remove(req)
        self.waiting.append(req)

    def check_ref_counts(self) -> None:
        for manager in self.manager.coordinator.managers:
            holders = Counter(
                block.block_id
                for blocks in manager.req_to_blocks.values()
                for block in blocks
                if not block.is_null
            )
            for block in manager.block_pool.blocks[1:]:
                assert block.ref_cnt == holders[block.block_id]
                assert (block.prev_free is not None) == (block.ref_cnt == 0)


@pytest.mark.parametrize("seed", range(40))
def test_random_schedules_keep_ref_counts_exact_and_hits_on_written_kv(seed):
    sim = _Simulation(seed)
    for index in range(60):
        sim.step(index)
        sim.check_ref_counts()
    for req in sim.running:
        sim.manager.free(req)
    for block_pool in sim.manager.coordinator.block_pools:
        assert block_pool.get_num_free_blocks() == block_pool.num_blocks - 1
