"""The scheduler with speculative drafts: budget, lookahead slots, rollback, trimming, stats."""

from __future__ import annotations

import pytest
import torch

from core.config import EngineConfig, SchedulerConfig, SpeculativeConfig
from core.kv_cache.grouping import kv_cache_config_for_blocks
from core.kv_cache.kv_cache_manager import KVCacheManager
from core.kv_cache.spec import FullAttentionSpec
from core.request import Request
from core.sampling_params import SamplingParams
from core.scheduler.scheduler import Scheduler
from core.worker.contract import ModelRunnerOutput, SchedulerOutput

BLOCK = 4
MAX_LEN = 32
K = 3


def make_scheduler(num_blocks: int = 64, lookahead: int = 0, **sched) -> Scheduler:
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=2, dtype=torch.float32)
    kv = KVCacheManager(kv_cache_config_for_blocks({"l0": spec}, num_blocks), MAX_LEN)
    config = EngineConfig(
        scheduler=SchedulerConfig(**sched),
        speculative=SpeculativeConfig(method="ngram", num_speculative_tokens=K),
    )
    return Scheduler(config, kv, MAX_LEN, num_lookahead_tokens=lookahead)


def add(scheduler: Scheduler, req_id: str, num_prompt: int, max_tokens: int = 20) -> Request:
    request = Request(
        req_id,
        list(range(1, num_prompt + 1)),
        SamplingParams(temperature=0.0, max_tokens=max_tokens),
        eos_token_id=None,
        arrival_time=0.0,
        block_hasher=scheduler.kv.block_hasher,
        max_model_len=MAX_LEN,
    )
    scheduler.add_request(request)
    return request


def finish_step(
    scheduler: Scheduler,
    so: SchedulerOutput,
    sampled: dict[str, list[int]],
    drafts: dict[str, list[int]] | None = None,
) -> None:
    req_ids = list(so.num_scheduled_tokens)
    output = ModelRunnerOutput(
        req_ids=req_ids,
        sampled_token_ids=[sampled.get(r, []) for r in req_ids],
        spec_token_ids=[(drafts or {}).get(r, []) for r in req_ids],
    )
    scheduler.update_from_output(so, output)


def test_drafts_are_scheduled_after_the_known_tokens_and_counted_in_the_budget():
    scheduler = make_scheduler()
    request = add(scheduler, "a", 5)
    finish_step(scheduler, scheduler.schedule(), {"a": [9]}, {"a": [10, 11, 12]})
    assert request.drafts.token_ids == [10, 11, 12]
    so = scheduler.schedule()
    assert so.num_scheduled_tokens == {"a": 4}  # the new token 9 and three drafts
    assert so.scheduled_spec_decode_tokens == {"a": [10, 11, 12]}
    assert so.total_num_scheduled_tokens == 4


def test_rejected_drafts_roll_num_computed_tokens_back():
    scheduler = make_scheduler()
    request = add(scheduler, "a", 5)
    finish_step(scheduler, scheduler.schedule(), {"a": [9]}, {"a": [10, 11, 12]})
    so = scheduler.schedule()
    assert request.num_computed_tokens == 9  # 5 + the 4 scheduled, before verification
    # Draft 10 accepted, 11 rejected: the target emits 10 and its own token 20.
    finish_step(scheduler, so, {"a": [10, 20]})
    assert request.output_token_ids == [9, 10, 20]
    assert request.num_computed_tokens == 7  # prompt, 9 and 10: the KV of 11, 12 is void
    assert request.num_tokens == 8
    stats = scheduler.make_stats().spec_decoding
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (1, 3, 1)
    assert stats.num_accepted_tokens_per_pos == [1, 0, 0]


def test_all_drafts_accepted_plus_a_bonus_token():
    scheduler = make_scheduler()
    request = add(scheduler, "a", 5)
    finish_step(scheduler, scheduler.schedule(), {"a": [9]}, {"a": [10, 11, 12]})
    finish_step(scheduler, scheduler.schedule(), {"a": [10, 11, 12, 13]})
    assert request.output_token_ids == [9, 10, 11, 12, 13]
    assert request.num_computed_tokens == 9
    assert scheduler.make_stats().spec_decoding.num_accepted_tokens_per_pos == [1, 1, 1]


@pytest.mark.parametrize(
    ("budget", "scheduled", "drafts"),
    [
        (8, {"a": 4, "b": 4}, {"a": [1, 2, 3], "b": [4, 5, 6]}),
        (6, {"a": 4, "b": 2}, {"a": [1, 2, 3], "b": [4]}),  # b keeps the draft that fits
    ],
)
def test_drafts_that_the_budget_cuts_off_are_dropped(budget, scheduled, drafts):
    scheduler = make_scheduler(max_num_batched_tokens=budget)
    add(scheduler, "a", 2)
    b = add(scheduler, "b", 2)
    first = scheduler.schedule()
    finish_step(scheduler, first, {"a": [9], "b": [9]}, {"a": [1, 2, 3], "b": [4, 5, 6]})
    so = scheduler.schedule()
    assert so.num_scheduled_tokens == scheduled
    assert so.scheduled_spec_decode_tokens == drafts
    assert b.drafts.token_ids == drafts["b"]


def test_drafts_are_trimmed_so_max_tokens_cannot_be_passed():
    scheduler = make_scheduler()
    request = add(scheduler, "a", 5, max_tokens=3)
    finish_step(scheduler, scheduler.schedule(), {"a": [9]}, {"a": [10, 11, 12]})
    # One token out, two may follow: verifying one draft can emit two.
    assert request.drafts.token_ids == [10]


def test_drafts_are_trimmed_to_max_model_len():
    scheduler = make_scheduler()
    request = add(scheduler, "a", MAX_LEN - 3, max_tokens=50)
    finish_step(scheduler, scheduler.schedule(), {"a": [9]}, {"a": [10, 11, 12]})
    assert request.num_tokens == MAX_LEN - 2
    assert request.drafts.token_ids == [10]


def test_lookahead_slots_are_allocated_for_proposers_that_write_kv():
    plain, ahead = make_scheduler(), make_scheduler(lookahead=K)
    for scheduler in (plain, ahead):
        add(scheduler, "b", 6)
        scheduler.schedule()
    assert len(plain.kv.get_block_ids("b")[0]) == 2  # 6 slots in blocks of 4
    assert len(ahead.kv.get_block_ids("b")[0]) == 3  # 6 + 3 lookahead slots


def test_preemption_clears_drafts():
    scheduler = make_scheduler(num_blocks=4)  # 3 usable blocks of 4 tokens
    add(scheduler, "a", 4)
    add(scheduler, "b", 4)
    finish_step(scheduler, scheduler.schedule(), {"a": [9], "b": [9]}, {"a": [1, 2], "b": [3, 4]})
    so = scheduler.schedule()  # each needs a second block for 3 tokens: one is preempted
    preempted = [r for r in ("a", "b") if r not in so.num_scheduled_tokens]
    assert len(preempted) == 1
    assert scheduler.requests[preempted[0]].drafts.token_ids == []
    assert preempted[0] not in so.scheduled_spec_decode_tokens


def test_no_drafts_are_kept_for_a_finished_request():
    scheduler = make_scheduler()
    request = add(scheduler, "a", 5, max_tokens=1)
    finish_step(scheduler, scheduler.schedule(), {"a": [9]}, {"a": [10, 11]})
    assert request.is_finished and request.drafts.token_ids == []


def test_block_hashes_cover_verified_tokens_only():
    scheduler = make_scheduler()
    request = add(scheduler, "a", 5)
    finish_step(scheduler, scheduler.schedule(), {"a": [9]}, {"a": [10, 11, 12]})
    scheduler.schedule()
    # 6 known tokens and 3 drafts: 9 with drafts would fill two blocks of 4; one is hashed.
    assert request.num_tokens_with_spec == 9
    assert len(request.block_hashes) == 1
