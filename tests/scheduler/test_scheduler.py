"""The scheduler on a real KV-cache manager, with a fake model that samples token 7."""

from __future__ import annotations

import itertools
import zlib

import pytest
import torch

from core.config import EngineConfig, SchedulerConfig
from core.kv_cache.grouping import kv_cache_config_for_blocks
from core.kv_cache.kv_cache_manager import KVCacheManager
from core.kv_cache.spec import FullAttentionSpec
from core.request import FinishReason, Request, RequestStatus
from core.sampling_params import SamplingParams
from core.scheduler.scheduler import Scheduler
from core.worker.contract import ModelRunnerOutput, SchedulerOutput

BLOCK = 4
MAX_LEN = 64
EOS = 0
_arrivals = itertools.count()


def make_scheduler(num_blocks: int = 64, **sched) -> Scheduler:
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=2, dtype=torch.float32)
    kv_config = kv_cache_config_for_blocks({"layer.0": spec}, num_blocks)
    kv = KVCacheManager(kv_config, MAX_LEN, enable_caching=True)
    config = EngineConfig(scheduler=SchedulerConfig(**sched))
    return Scheduler(config, kv, MAX_LEN)


def make_request(
    scheduler: Scheduler, req_id: str, num_prompt: int, max_tokens: int = 4, priority: int = 0
) -> Request:
    # crc32, unlike hash(), is the same in every process: the same prompts on every run.
    prompt = [(zlib.crc32(req_id.encode()) + i) % 100 + 1 for i in range(num_prompt)]
    request = Request(
        req_id,
        prompt,
        SamplingParams(temperature=0.0, max_tokens=max_tokens),
        eos_token_id=EOS,
        arrival_time=next(_arrivals),
        priority=priority,
        block_hasher=scheduler.kv.block_hasher,
        max_model_len=MAX_LEN,
    )
    scheduler.add_request(request)
    return request


def fake_run(
    scheduler: Scheduler, so: SchedulerOutput, eos_at: int | None = None
) -> ModelRunnerOutput:
    """Sample token 7 for every request whose scheduled tokens reach its known end; EOS (0)
    instead as output token number `eos_at` (0-based), when given."""
    req_ids = list(so.num_scheduled_tokens)
    sampled = []
    for req_id in req_ids:
        request = scheduler.requests[req_id]
        token = EOS if request.num_output_tokens == eos_at else 7
        sampled.append([token] if request.num_computed_tokens == request.num_tokens else [])
    return ModelRunnerOutput(req_ids=req_ids, sampled_token_ids=sampled)


def step(scheduler: Scheduler, eos_at: int | None = None) -> SchedulerOutput:
    so = scheduler.schedule()
    scheduler.update_from_output(so, fake_run(scheduler, so, eos_at))
    return so


def test_token_budget_holds_at_every_step():
    scheduler = make_scheduler(max_num_batched_tokens=16, max_num_seqs=8)
    for i in range(6):
        make_request(scheduler, f"r{i}", num_prompt=5 + 3 * i)
    while scheduler.has_unfinished_requests():
        so = step(scheduler)
        assert 0 < so.total_num_scheduled_tokens <= 16
        assert so.total_num_scheduled_tokens == sum(so.num_scheduled_tokens.values())


def test_long_prompt_is_prefilled_in_chunks():
    scheduler = make_scheduler(max_num_batched_tokens=8)
    request = make_request(scheduler, "long", num_prompt=20)
    chunks = []
    while request.num_output_tokens == 0:
        chunks.append(step(scheduler).num_scheduled_tokens["long"])
    assert chunks == [8, 8, 4]


def test_decodes_keep_progressing_while_a_long_prefill_runs():
    scheduler = make_scheduler(max_num_batched_tokens=8)
    short = make_request(scheduler, "short", num_prompt=3, max_tokens=10)
    step(scheduler)  # short prefilled, samples its first token
    make_request(scheduler, "long", num_prompt=30)
    for _ in range(4):
        so = step(scheduler)
        assert so.num_scheduled_tokens["short"] == 1  # one decode token every step
        assert so.num_scheduled_tokens["long"] == 7
    assert short.num_output_tokens == 5


def test_a_burst_of_arrivals_is_admitted_in_one_step_beside_few_streams():
    scheduler = make_scheduler(max_num_batched_tokens=8, burst_token_budget=256)
    first = make_request(scheduler, "first", num_prompt=6, max_tokens=20)
    step(scheduler)  # alone: a burst of one (6 tokens)
    burst = [make_request(scheduler, f"b{i}", num_prompt=20) for i in range(4)]
    so = step(scheduler)  # 1 running, 4 waiting: the burst budget
    assert so.num_scheduled_tokens == {"first": 1, **{r.request_id: 20 for r in burst}}
    assert all(r.num_output_tokens == 1 for r in burst)
    assert step(scheduler).total_num_scheduled_tokens == 5  # then decodes as one wave
    assert first.num_output_tokens == 3


def test_the_step_budget_holds_while_the_streams_are_many_beside_the_arrivals():
    scheduler = make_scheduler(max_num_batched_tokens=8, burst_token_budget=256)
    for i in range(2):
        make_request(scheduler, f"run{i}", num_prompt=3, max_tokens=20)
    step(scheduler)  # both admitted in a burst (none running)
    for i in range(7):  # 2 running * 4 > 7 waiting: no burst
        make_request(scheduler, f"w{i}", num_prompt=20)
    assert scheduler.token_budget() == 8
    make_request(scheduler, "w7", num_prompt=20)  # 2 * 4 <= 8 waiting: a burst
    assert scheduler.token_budget() == 256
    assert step(scheduler).total_num_scheduled_tokens == 2 + 8 * 20


def test_a_queue_behind_a_full_batch_is_no_burst():
    scheduler = make_scheduler(max_num_batched_tokens=8, burst_token_budget=256, max_num_seqs=2)
    for i in range(2):
        make_request(scheduler, f"run{i}", num_prompt=3, max_tokens=20)
    step(scheduler)  # both running: max_num_seqs reached
    for i in range(12):  # 2 * 4 <= 12 waiting, but none may be admitted
        make_request(scheduler, f"w{i}", num_prompt=20)
    assert scheduler.token_budget() == 8


def _wave_of_six(scheduler: Scheduler) -> list[Request]:
    """Six arrivals of 12 prompt tokens (72 in all) onto an idle scheduler."""
    return [make_request(scheduler, f"w{i}", num_prompt=12, max_tokens=20) for i in range(6)]


def test_a_wave_larger_than_the_burst_budget_is_prefilled_over_consecutive_burst_steps():
    scheduler = make_scheduler(max_num_batched_tokens=8, burst_token_budget=32, max_num_seqs=8)
    wave = _wave_of_six(scheduler)
    # 12 + 12 + 8 = 32: the third prompt is chunked at the end of the burst budget.
    assert step(scheduler).num_scheduled_tokens == {"w0": 12, "w1": 12, "w2": 8}
    assert [r.num_output_tokens for r in wave] == [1, 1, 0, 0, 0, 0]  # first tokens now
    # 3 running, 3 waiting: past BURST_RATIO, but the burst goes on at 32 tokens.
    so = step(scheduler)
    assert so.num_scheduled_tokens == {"w0": 1, "w1": 1, "w2": 4, "w3": 12, "w4": 12, "w5": 2}
    # The last prompt's remaining 10 tokens, not a trickle at 8 beside five decodes.
    so = step(scheduler)
    assert so.num_scheduled_tokens == {"w0": 1, "w1": 1, "w2": 1, "w3": 1, "w4": 1, "w5": 10}
    assert [r.num_output_tokens for r in wave] == [3, 3, 2, 2, 2, 1]
    # The burst is over: an arrival beside six streams gets what 8 tokens leave.
    assert scheduler.token_budget() == 8
    make_request(scheduler, "late", num_prompt=20)
    assert step(scheduler).num_scheduled_tokens == {**{r.request_id: 1 for r in wave}, "late": 2}


def test_streams_running_before_a_burst_are_scheduled_in_every_burst_step():
    scheduler = make_scheduler(max_num_batched_tokens=8, burst_token_budget=24)
    first = make_request(scheduler, "first", num_prompt=3, max_tokens=30)
    step(scheduler)
    for i in range(4):  # 64 tokens: three steps of at most 24
        make_request(scheduler, f"w{i}", num_prompt=16)
    burst_steps = [step(scheduler).num_scheduled_tokens for _ in range(3)]
    assert burst_steps == [
        {"first": 1, "w0": 16, "w1": 7},
        {"first": 1, "w0": 1, "w1": 9, "w2": 13},
        {"first": 1, "w0": 1, "w1": 1, "w2": 3, "w3": 16},
    ]
    assert first.num_output_tokens == 4  # one token per step, burst steps included
    assert scheduler.token_budget() == 8


def test_arrivals_during_a_burst_share_its_last_step_but_do_not_prolong_it():
    scheduler = make_scheduler(max_num_batched_tokens=8, burst_token_budget=32, max_num_seqs=8)
    wave = _wave_of_six(scheduler)
    step(scheduler)
    late = [make_request(scheduler, f"late{i}", num_prompt=12) for i in range(2)]
    step(scheduler)  # the wave's w3, w4 and a chunk of w5 fill the budget
    so = step(scheduler)  # w5's last 10 tokens and five decodes leave 17 tokens
    assert so.num_scheduled_tokens == {
        **{r.request_id: 1 for r in wave[:5]},
        "w5": 10,
        "late0": 12,
        "late1": 5,
    }
    # The wave is prefilled: late1's last 7 tokens go at the step budget, 1 beside 7 decodes.
    so = step(scheduler)
    assert so.num_scheduled_tokens == {**{r.request_id: 1 for r in wave}, "late0": 1, "late1": 1}
    assert late[1].num_output_tokens == 0


def test_a_burst_whose_remaining_requests_are_all_blocked_ends():
    from core.sampling_params import StructuredOutputsParams

    scheduler = make_scheduler(max_num_batched_tokens=8, burst_token_budget=32)
    grammars = scheduler.grammars = SlowGrammars()
    params = SamplingParams(
        temperature=0.0, max_tokens=8, structured_outputs=StructuredOutputsParams(regex="a+")
    )
    constrained = Request("regex", list(range(1, 13)), params, EOS, next(_arrivals),
                          block_hasher=scheduler.kv.block_hasher,
                          max_model_len=MAX_LEN)  # fmt: skip
    scheduler.add_request(constrained)
    for i in range(4):
        make_request(scheduler, f"p{i}", num_prompt=12, max_tokens=8)
    assert step(scheduler).num_scheduled_tokens == {"p0": 12, "p1": 12, "p2": 8}
    assert step(scheduler).num_scheduled_tokens == {"p0": 1, "p1": 1, "p2": 4, "p3": 12}
    step(scheduler)  # only decodes: "regex", still compiling, is all the burst has left
    grammars.ready.add("regex")
    # The burst ended with that step: "regex" gets what 8 tokens leave beside 4 decodes.
    so = step(scheduler)
    assert so.num_scheduled_tokens == {"p0": 1, "p1": 1, "p2": 1, "p3": 1, "regex": 4}


def test_a_burst_under_preemption_finishes_every_request_without_a_leak():
    # 13 blocks = null + 12 of 4 tokens: four requests of up to 20 tokens need 20.
    scheduler = make_scheduler(num_blocks=13, max_num_batched_tokens=8, burst_token_budget=32)
    requests = [make_request(scheduler, f"r{i}", num_prompt=8, max_tokens=12) for i in range(4)]
    while scheduler.has_unfinished_requests():
        assert step(scheduler).total_num_scheduled_tokens <= 32
    assert sum(r.num_preemptions for r in requests) > 0
    assert all(r.output_token_ids == [7] * 12 for r in requests)
    pool = scheduler.kv.coordinator.block_pools[0]
    assert pool.get_num_free_blocks() == 12
    assert scheduler.token_budget() == 8


def test_without_a_burst_budget_every_step_keeps_the_step_budget():
    scheduler = make_scheduler(max_num_batched_tokens=8)
    for i in range(6):
        make_request(scheduler, f"r{i}", num_prompt=20)
    assert scheduler.token_budget() == 8
    assert step(scheduler).total_num_scheduled_tokens == 8


def test_long_prefill_threshold_caps_each_chunk():
    scheduler = make_scheduler(max_num_batched_tokens=32, long_prefill_token_threshold=6)
    make_request(scheduler, "long", num_prompt=20)
    assert step(scheduler).num_scheduled_tokens["long"] == 6


def test_max_num_seqs_limits_running_requests():
    scheduler = make_scheduler(max_num_seqs=2)
    for i in range(3):
        make_request(scheduler, f"r{i}", num_prompt=4)
    assert sorted(step(scheduler).num_scheduled_tokens) == ["r0", "r1"]


def test_fcfs_preempts_the_last_running_request_when_blocks_run_out():
    # 9 blocks = null + 8 usable blocks of 4 tokens.
    scheduler = make_scheduler(num_blocks=9, max_num_batched_tokens=64)
    first = make_request(scheduler, "first", num_prompt=12, max_tokens=12)
    second = make_request(scheduler, "second", num_prompt=12, max_tokens=12)
    step(scheduler)  # both prefilled: 3 blocks each, 2 free
    preempted_at = None
    for i in range(12):
        step(scheduler)
        if second.status == RequestStatus.PREEMPTED and preempted_at is None:
            preempted_at = i
    assert preempted_at is not None
    assert first.num_preemptions == 0 and second.num_preemptions >= 1
    while scheduler.has_unfinished_requests():
        step(scheduler)
    assert first.get_finished_reason() == second.get_finished_reason() == FinishReason.LENGTH
    assert second.output_token_ids == [7] * 12


def test_priority_policy_admits_and_preempts_by_priority():
    scheduler = make_scheduler(num_blocks=9, max_num_seqs=1, policy="priority")
    make_request(scheduler, "low", num_prompt=4, priority=5)
    make_request(scheduler, "high", num_prompt=4, priority=1)
    assert list(step(scheduler).num_scheduled_tokens) == ["high"]

    scheduler = make_scheduler(num_blocks=9, policy="priority")
    urgent = make_request(scheduler, "urgent", num_prompt=12, max_tokens=12, priority=0)
    lazy = make_request(scheduler, "lazy", num_prompt=12, max_tokens=12, priority=9)
    while urgent.status != RequestStatus.FINISHED_LENGTH_CAPPED:
        step(scheduler)
    assert urgent.num_preemptions == 0 and lazy.num_preemptions >= 1


def test_abort_frees_blocks_of_running_and_waiting_requests():
    scheduler = make_scheduler(max_num_seqs=1)
    make_request(scheduler, "running", num_prompt=9, max_tokens=20)
    make_request(scheduler, "waiting", num_prompt=9, max_tokens=20)
    step(scheduler)
    free_before = scheduler.kv.coordinator.block_pools[0].get_num_free_blocks()
    assert scheduler.kv.usage > 0
    scheduler.finish_requests(["running", "waiting"], RequestStatus.FINISHED_ABORTED)
    assert not scheduler.has_unfinished_requests()
    pool = scheduler.kv.coordinator.block_pools[0]
    assert pool.get_num_free_blocks() > free_before
    assert pool.get_usage() == 0
    assert scheduler.schedule().finished_req_ids == {"running", "waiting"}


def test_prefix_cache_hit_is_scheduled_as_computed_tokens():
    scheduler = make_scheduler()
    first = make_request(scheduler, "first", num_prompt=12)
    step(scheduler)
    twin = Request("twin", list(first.prompt_token_ids) + [99], first.sampling_params, 0,
                   next(_arrivals), block_hasher=scheduler.kv.block_hasher,
                   max_model_len=MAX_LEN)  # fmt: skip
    scheduler.add_request(twin)
    so = step(scheduler)
    new = next(r for r in so.scheduled_new_reqs if r.req_id == "twin")
    assert new.num_computed_tokens == 12  # three full cached blocks
    assert so.num_scheduled_tokens["twin"] == 1
    assert twin.num_cached_tokens == 12


@pytest.mark.parametrize(
    ("eos_at", "reason", "num_output"), [(None, FinishReason.LENGTH, 6), (2, FinishReason.STOP, 3)]
)
def test_no_leak_after_everything_finishes(eos_at, reason, num_output):
    scheduler = make_scheduler(num_blocks=12, max_num_batched_tokens=16)
    requests = [make_request(scheduler, f"r{i}", num_prompt=3 + i, max_tokens=6) for i in range(8)]
    while scheduler.has_unfinished_requests():
        step(scheduler, eos_at)
    assert {r.get_finished_reason() for r in requests} == {reason}
    assert {r.num_output_tokens for r in requests} == {num_output}
    pool = scheduler.kv.coordinator.block_pools[0]
    assert pool.get_num_free_blocks() == 11
    assert all(block.ref_cnt == 0 for block in pool.blocks[1:])


class SlowGrammars:
    """A grammar manager whose compiles finish only when the test says so."""

    def __init__(self) -> None:
        self.ready: set[str] = set()
        self.submitted: set[str] = set()
        self.failed: dict[str, str] = {}

    def submit(self, request_id, params) -> None:
        self.submitted.add(request_id)

    def is_ready(self, request_id) -> bool:
        return request_id in self.ready or request_id in self.failed

    def error(self, request_id):
        return self.failed.get(request_id)

    def build_bitmask(self, request_ids, drafts=None):
        return None

    def accept_tokens(self, request_id, ids) -> bool:
        return True

    def is_terminated(self, request_id) -> bool:
        return False

    def remove(self, request_id) -> None:
        self.submitted.discard(request_id)

    def __contains__(self, request_id) -> bool:
        return request_id in self.submitted


def test_a_request_waiting_for_its_grammar_does_not_block_the_others():
    from core.sampling_params import StructuredOutputsParams

    scheduler = make_scheduler()
    grammars = scheduler.grammars = SlowGrammars()
    constrained = Request("json", [1, 2, 3], SamplingParams(
        temperature=0.0, max_tokens=4,
        structured_outputs=StructuredOutputsParams(json_object=True)),
        eos_token_id=0, arrival_time=next(_arrivals), max_model_len=MAX_LEN)  # fmt: skip
    scheduler.add_request(constrained)
    make_request(scheduler, "plain", num_prompt=3)
    assert constrained.status == RequestStatus.WAITING_FOR_GRAMMAR
    assert list(step(scheduler).num_scheduled_tokens) == ["plain"]
    assert constrained.status == RequestStatus.WAITING_FOR_GRAMMAR
    grammars.ready.add("json")
    assert "json" in step(scheduler).num_scheduled_tokens


def test_a_grammar_that_fails_to_compile_finishes_its_request_with_an_error():
    from core.sampling_params import StructuredOutputsParams

    scheduler = make_scheduler()
    grammars = scheduler.grammars = SlowGrammars()
    params = SamplingParams(structured_outputs=StructuredOutputsParams(regex="("))
    request = Request("bad", [1, 2], params, 0, next(_arrivals), max_model_len=MAX_LEN)
    scheduler.add_request(request)
    grammars.failed["bad"] = "invalid regex"
    so = scheduler.schedule()
    outputs = scheduler.update_from_output(so, fake_run(scheduler, so)).outputs
    assert [(o.request_id, o.finish_reason) for o in outputs] == [("bad", FinishReason.ERROR)]
    assert not scheduler.has_unfinished_requests()


def test_each_output_carries_the_lifecycle_events_since_the_previous_one():
    from core.request import EngineCoreEventType as Event

    # As in the FCFS preemption test: "second" loses its blocks and is scheduled again.
    scheduler = make_scheduler(num_blocks=9, max_num_batched_tokens=64)
    first = make_request(scheduler, "first", num_prompt=12, max_tokens=12)
    second = make_request(scheduler, "second", num_prompt=12, max_tokens=12)
    events: dict[str, list] = {"first": [], "second": []}
    while scheduler.has_unfinished_requests():
        so = scheduler.schedule()
        for output in scheduler.update_from_output(so, fake_run(scheduler, so)).outputs:
            events[output.request_id] += output.events or []
    assert [e.type for e in events["first"]] == [Event.QUEUED, Event.SCHEDULED]
    assert first.num_preemptions == 0 and second.num_preemptions >= 1
    after_preemptions = [Event.PREEMPTED, Event.SCHEDULED] * second.num_preemptions
    kinds = [e.type for e in events["second"]]
    assert kinds == [Event.QUEUED, Event.SCHEDULED, *after_preemptions]
    stamps = [e.timestamp for e in events["second"]]
    assert stamps == sorted(stamps)
