"""IterationStats as the OutputProcessor fills them from hand-made engine-core traffic: the
phases of a request come from its engine events and the batches' engine timestamps, what
the user waits for from the frontend's clock, and aborts are reported at once."""

from __future__ import annotations

import time

import pytest
import torch
from engine_output_helpers import make_request

from core.config import EngineConfig, SchedulerConfig
from core.engine.output_processor import OutputProcessor, RequestOutputKind
from core.engine.protocol import (
    EngineCoreEvent,
    EngineCoreEventType,
    EngineCoreOutput,
    EngineCoreOutputs,
    FinishReason,
    SchedulerStats,
)
from core.engine.stats import IterationStats
from core.kv_cache.grouping import kv_cache_config_for_blocks
from core.kv_cache.kv_cache_manager import KVCacheManager
from core.kv_cache.spec import FullAttentionSpec
from core.request import Request
from core.scheduler.scheduler import Scheduler
from core.worker.contract import ModelRunnerOutput

QUEUED, SCHEDULED, PREEMPTED = (
    EngineCoreEventType.QUEUED,
    EngineCoreEventType.SCHEDULED,
    EngineCoreEventType.PREEMPTED,
)
IDLE = SchedulerStats(
    num_running=0, num_waiting=0, kv_cache_usage=0.0, prefix_cache_queries=0,
    prefix_cache_hits=0, num_preemptions=0,
)  # fmt: skip


@pytest.fixture
def updates() -> list[IterationStats]:
    return []


@pytest.fixture
def processor(updates) -> OutputProcessor:
    return OutputProcessor(None, updates.append)


def add(processor: OutputProcessor, request_id: str, prompt: list[int], **params) -> None:
    request = make_request(request_id, prompt, detokenize=False, **params)
    request.arrival_time = time.time()
    processor.add_request(request, output_kind=RequestOutputKind.DELTA)


def batch(timestamp: float, *outputs: EngineCoreOutput, engine: int = 0) -> EngineCoreOutputs:
    return EngineCoreOutputs(
        outputs=list(outputs), timestamp=timestamp, scheduler_stats=IDLE, engine_index=engine
    )


def token(request_id: str, *events: tuple[EngineCoreEventType, float], **fields):
    return EngineCoreOutput(
        request_id=request_id,
        new_token_ids=[5],
        events=[EngineCoreEvent(kind, ts) for kind, ts in events] or None,
        **fields,
    )


def test_phases_come_from_engine_events_and_batch_timestamps(processor, updates):
    add(processor, "r", [1, 2, 3], max_tokens=3)
    processor.process_outputs(batch(11.0, token("r", (QUEUED, 10.0), (SCHEDULED, 10.5))))
    processor.process_outputs(batch(11.25, token("r")))
    processor.process_outputs(batch(12.0, token("r", finish_reason=FinishReason.LENGTH)))
    (done,) = updates[-1].finished_requests
    assert done.finish_reason == FinishReason.LENGTH
    assert (done.num_prompt_tokens, done.num_generation_tokens) == (3, 3)
    assert done.queued_time == pytest.approx(0.5)  # 10.0 -> 10.5
    assert done.prefill_time == pytest.approx(0.5)  # 10.5 -> first token at 11.0
    assert done.decode_time == pytest.approx(1.0)  # 11.0 -> 12.0
    assert done.inference_time == pytest.approx(1.5)  # 10.5 -> 12.0
    assert [u.inter_token_latencies for u in updates] == [[], [0.25], [0.75]]
    assert [u.num_generation_tokens for u in updates] == [1, 1, 1]
    assert [u.num_prompt_tokens for u in updates] == [3, 0, 0]


def test_time_to_first_token_and_e2e_run_on_the_frontend_clock(processor, updates):
    before = time.time()
    add(processor, "r", [1, 2], max_tokens=2)
    processor.process_outputs(batch(5.0, token("r")))
    processor.process_outputs(batch(6.0, token("r", finish_reason=FinishReason.STOP)))
    after = time.time()
    ((ttft,),) = [u.time_to_first_tokens for u in updates[:1]]
    (done,) = updates[1].finished_requests
    assert 0 <= ttft <= done.e2e_latency <= after - before


def test_a_preempted_request_keeps_its_first_admission_as_the_start_of_its_prefill(
    processor, updates
):
    add(processor, "r", [1, 2], max_tokens=1)
    events = [(QUEUED, 1.0), (SCHEDULED, 2.0), (PREEMPTED, 3.0), (SCHEDULED, 4.0)]
    processor.process_outputs(batch(5.0, token("r", *events, finish_reason=FinishReason.LENGTH)))
    (done,) = updates[0].finished_requests
    assert (done.queued_time, done.prefill_time) == (1.0, 3.0)


def test_iteration_tokens_count_uncached_prompt_and_generated_tokens(processor, updates):
    add(processor, "a", list(range(1, 10)), max_tokens=2)
    add(processor, "b", [1, 2, 3], max_tokens=2)
    processor.process_outputs(batch(1.0, token("a", num_cached_tokens=8), token("b")))
    processor.process_outputs(batch(2.0, token("a"), token("b")))
    assert [u.num_tokens for u in updates] == [(9 - 8 + 1) + (3 + 1), 2]
    assert (updates[0].num_prompt_tokens, updates[0].num_cached_prompt_tokens) == (12, 8)


def test_each_of_n_samples_is_one_engine_request(processor, updates):
    add(processor, "r", [1, 2, 3, 4], n=2, max_tokens=1)
    done = FinishReason.LENGTH
    processor.process_outputs(
        batch(1.0, token("0_r", finish_reason=done), token("1_r", finish_reason=done))
    )
    assert updates[0].num_prompt_tokens == 8
    assert len(updates[0].finished_requests) == 2


def test_a_request_the_engine_aborted_on_its_own_finishes_as_aborted(processor, updates):
    add(processor, "r", [1, 2], max_tokens=4)
    processor.process_outputs(batch(1.0, token("r", (QUEUED, 0.5), (SCHEDULED, 0.75))))
    processor.process_outputs(
        EngineCoreOutputs(finished_requests={"r"}, scheduler_stats=IDLE, timestamp=2.0)
    )
    (done,) = updates[-1].finished_requests
    assert (done.finish_reason, done.num_generation_tokens) == (FinishReason.ABORT, 1)


def test_aborts_are_reported_at_once_per_engine_without_a_step(processor, updates):
    add(processor, "served", [1, 2], max_tokens=4)
    add(processor, "queued", [1, 2, 3], max_tokens=4)
    processor.process_outputs(batch(1.0, token("served", (SCHEDULED, 0.5)), engine=1))
    updates.clear()
    processor.abort_requests(["served", "queued", "unknown"])
    by_engine = {u.engine_index: u for u in updates}
    assert sorted(by_engine) == [0, 1] and not any(u.is_engine_step for u in updates)
    (served,) = by_engine[1].finished_requests
    (queued,) = by_engine[0].finished_requests  # no output yet: engine 0
    assert served.finish_reason == queued.finish_reason == FinishReason.ABORT
    assert served.prefill_time == 0.5 and served.decode_time == 0.0
    assert (queued.queued_time, queued.prefill_time, queued.decode_time) == (None, None, None)
    assert all(u.num_tokens == 0 for u in updates)


def test_a_steps_kv_transfer_times_become_its_updates_observations(processor, updates):
    outputs = batch(1.0)
    outputs.kv_transfer_times = [0.002, 0.03]
    processor.process_outputs(outputs)
    assert updates[-1].kv_transfer_times == [0.002, 0.03]


def test_preemptions_are_counted_from_the_events_of_every_output(processor, updates):
    add(processor, "r", [1, 2], max_tokens=3)
    processor.process_outputs(batch(1.0, token("r", (QUEUED, 0.1), (SCHEDULED, 0.2))))
    processor.process_outputs(batch(2.0, token("r", (PREEMPTED, 1.1), (SCHEDULED, 1.5))))
    last = token("r", (PREEMPTED, 2.1), (SCHEDULED, 2.5), finish_reason=FinishReason.LENGTH)
    processor.process_outputs(batch(3.0, last))
    (done,) = updates[-1].finished_requests
    assert done.num_preemptions == 2


def test_every_sample_carries_max_tokens_and_the_last_to_finish_carries_n(processor, updates):
    add(processor, "r", [1, 2, 3], n=2, max_tokens=5)
    processor.process_outputs(batch(1.0, token("1_r", finish_reason=FinishReason.STOP)))
    processor.process_outputs(batch(2.0, token("0_r", finish_reason=FinishReason.LENGTH)))
    (first,), (last,) = (u.finished_requests for u in updates)
    assert (first.max_tokens_param, first.n_param) == (5, None)
    assert (last.max_tokens_param, last.n_param) == (5, 2)


def test_an_aborted_request_observes_n_once_and_no_max_tokens_when_it_had_none(processor, updates):
    add(processor, "r", [1, 2], n=3, max_tokens=None)
    processor.process_outputs(batch(1.0, token("2_r", finish_reason=FinishReason.LENGTH)))
    processor.abort_requests(["r"])
    finished = [f for u in updates for f in u.finished_requests]
    assert [f.n_param for f in finished] == [None, None, 3]
    assert {f.max_tokens_param for f in finished} == {None}


def test_a_preemption_the_scheduler_made_is_counted_once_for_its_request(processor, updates):
    """Through the real scheduler: 8 usable blocks of 4 tokens cannot hold two requests
    growing to 24 tokens, so the later one is preempted (as in the scheduler's tests)."""
    spec = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=2, dtype=torch.float32)
    kv = KVCacheManager(kv_cache_config_for_blocks({"layer.0": spec}, 9), 64)
    config = EngineConfig(scheduler=SchedulerConfig(max_num_batched_tokens=64))
    scheduler = Scheduler(config, kv, 64)
    requests = {}
    for req_id, first_token in (("first", 10), ("second", 40)):
        request = make_request(req_id, list(range(first_token, first_token + 12)), max_tokens=12,
                               detokenize=False, ignore_eos=True)  # fmt: skip
        processor.add_request(request)
        requests[req_id] = Request.from_engine_core_request(request, kv.block_hasher, 64)
        scheduler.add_request(requests[req_id])
    while scheduler.has_unfinished_requests():
        so = scheduler.schedule()
        req_ids = list(so.num_scheduled_tokens)
        sampled = [[7] if r.num_computed_tokens == r.num_tokens else []
                   for r in map(scheduler.requests.get, req_ids)]  # fmt: skip
        run = ModelRunnerOutput(req_ids=req_ids, sampled_token_ids=sampled)
        processor.process_outputs(scheduler.update_from_output(so, run))
    finished = [f for u in updates for f in u.finished_requests]
    assert [f.num_generation_tokens for f in finished] == [12, 12]
    assert requests["first"].num_preemptions == 0 and requests["second"].num_preemptions >= 1
    counted = sorted(f.num_preemptions for f in finished)
    assert counted == [0, requests["second"].num_preemptions]
