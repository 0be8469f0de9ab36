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


def make_scheduler(num_blocks: int = 64, kv_connector=None, **sched) -> Scheduler:
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=2, dtype=torch.float32)
    kv_config = kv_cache_config_for_blocks({"layer.0": spec}, num_blocks)
    kv = KVCacheManager(kv_config, MAX_LEN, enable_caching=True)
    config = EngineConfig(scheduler=SchedulerConfig(**sched))
    return Scheduler(config, kv, MAX_LEN, kv_connector=kv_connector)


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


def measured_scheduler(num_blocks: int = 64, burst: int = 256, **sched) -> Scheduler:
    """Step budgets measured up to `burst` tokens, fit to 4 ms a step plus 2 ms a token: a
    step's fixed cost is worth two prefill tokens (step_budget.py)."""
    scheduler = make_scheduler(
        num_blocks, max_num_batched_tokens=8, burst_token_budget=burst, **sched
    )
    for num_tokens in (1, 64):
        scheduler.budget.observe(num_tokens, 0.004 + 0.002 * num_tokens)
    return scheduler


def _decoding(scheduler: Scheduler, num: int) -> list[Request]:
    """`num` requests of 3 prompt tokens, admitted and past their first token."""
    requests = [make_request(scheduler, f"s{i}", num_prompt=3, max_tokens=30) for i in range(num)]
    while any(r.num_output_tokens == 0 for r in requests):
        step(scheduler)
    return requests


def test_a_wave_onto_an_idle_engine_samples_its_first_tokens_chunk_by_chunk():
    scheduler = measured_scheduler(max_num_seqs=8)
    wave = [make_request(scheduler, f"w{i}", num_prompt=12, max_tokens=20) for i in range(6)]
    # A quarter of each prompt (18 tokens) is within nine times the fixed cost's 2 tokens.
    assert step(scheduler).num_scheduled_tokens == {"w0": 12, "w1": 6}
    first_token_steps = {"w0": 1}
    for index in range(2, 9):
        so = step(scheduler)
        for request in wave:
            if request.request_id in first_token_steps:  # decoding: one token every step
                assert so.num_scheduled_tokens[request.request_id] == 1
            elif request.num_output_tokens:
                first_token_steps[request.request_id] = index
    assert first_token_steps == {"w0": 1, "w1": 2, "w2": 3, "w3": 4, "w4": 5, "w5": 8}


def test_a_short_arrival_beside_streams_is_admitted_at_once():
    scheduler = measured_scheduler()
    streams = _decoding(scheduler, 8)
    make_request(scheduler, "short", num_prompt=6)
    # 0.75 of the decode part (2 + 8 tokens) lets 6 tokens in.
    assert step(scheduler).num_scheduled_tokens == {**{r.request_id: 1 for r in streams},
                                                    "short": 6}  # fmt: skip


def test_a_long_arrival_beside_streams_is_prefilled_in_four_equal_chunks():
    scheduler = measured_scheduler()
    _decoding(scheduler, 8)
    long = make_request(scheduler, "long", num_prompt=40)
    chunks = [step(scheduler).num_scheduled_tokens["long"] for _ in range(4)]
    assert chunks == [10, 10, 10, 10] and long.num_output_tokens == 1


def test_arrivals_beyond_the_steady_share_raise_the_allowance():
    scheduler = measured_scheduler()
    _decoding(scheduler, 8)
    for i in range(4):
        make_request(scheduler, f"a{i}", num_prompt=40)
    assert step(scheduler).total_num_scheduled_tokens == 8 + 4 * 10


def test_measured_steps_never_exceed_the_burst_budget():
    scheduler = measured_scheduler(burst=24, max_num_seqs=16)
    for i in range(12):
        make_request(scheduler, f"r{i}", num_prompt=40, max_tokens=8)
    sizes = []
    while scheduler.has_unfinished_requests():
        sizes.append(step(scheduler).total_num_scheduled_tokens)
    assert max(sizes) == 24


def test_a_queue_behind_a_full_batch_adds_nothing_to_the_allowance():
    scheduler = measured_scheduler(max_num_seqs=2)
    _decoding(scheduler, 2)
    for i in range(12):
        make_request(scheduler, f"w{i}", num_prompt=20)
    assert scheduler.token_budget() == 2 + 3  # 0.75 of (2 + 2) tokens


def test_a_measured_budget_keeps_the_step_budget_until_a_step_is_timed():
    scheduler = make_scheduler(max_num_batched_tokens=8, burst_token_budget=256)
    for i in range(6):
        make_request(scheduler, f"r{i}", num_prompt=20)
    assert step(scheduler).total_num_scheduled_tokens == 8


def test_measured_budgets_under_preemption_finish_every_request_without_a_leak():
    # 13 blocks = null + 12 of 4 tokens: four requests of up to 20 tokens need 20.
    scheduler = measured_scheduler(num_blocks=13, burst=32)
    requests = [make_request(scheduler, f"r{i}", num_prompt=8, max_tokens=12) for i in range(4)]
    while scheduler.has_unfinished_requests():
        assert step(scheduler).total_num_scheduled_tokens <= 32
    assert sum(r.num_preemptions for r in requests) > 0
    assert all(r.output_token_ids == [7] * 12 for r in requests)
    pool = scheduler.kv.coordinator.block_pools[0]
    assert pool.get_num_free_blocks() == 12


def test_without_a_burst_budget_every_step_keeps_the_step_budget():
    scheduler = make_scheduler(max_num_batched_tokens=8)
    for i in range(6):
        make_request(scheduler, f"r{i}", num_prompt=20)
    scheduler.budget.observe(1, 0.01)
    scheduler.budget.observe(512, 1.0)
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

    def submit(self, request_id, params, prompt_token_ids=()) -> None:
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
