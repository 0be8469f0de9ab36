"""Async scheduling in the scheduler: step N+1 is scheduled before step N's tokens are
known (placeholders), and every request ends exactly as it does one step at a time.

A fake worker plays the model: it keeps each request's tokens as a model runner does
(appending what it samples itself) and samples a token that depends on all of them, EOS
included, so any token computed from the wrong context, lost or duplicated changes what
follows.
"""

from __future__ import annotations

import zlib
from collections import deque

import torch

from core.config import EngineConfig, SchedulerConfig
from core.kv_cache.grouping import kv_cache_config_for_blocks
from core.kv_cache.kv_cache_manager import KVCacheManager
from core.kv_cache.spec import FullAttentionSpec
from core.pooling.params import PoolingParams
from core.request import FinishReason, Request, RequestStatus
from core.sampling_params import SamplingParams
from core.scheduler.scheduler import Scheduler
from core.worker.contract import ModelRunnerOutput, SchedulerOutput

BLOCK = 4
MAX_LEN = 64
EOS = 0


def make_scheduler(async_scheduling: bool, num_blocks: int = 64, **sched) -> Scheduler:
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=2, dtype=torch.float32)
    kv = KVCacheManager(kv_cache_config_for_blocks({"l0": spec}, num_blocks), MAX_LEN, True)
    config = EngineConfig(scheduler=SchedulerConfig(async_scheduling=async_scheduling, **sched))
    return Scheduler(config, kv, MAX_LEN)


def free_blocks(scheduler: Scheduler) -> int:
    return scheduler.kv.coordinator.block_pools[0].get_num_free_blocks()


def add(scheduler: Scheduler, req_id: str, num_prompt: int, max_tokens: int) -> Request:
    prompt = [(zlib.crc32(req_id.encode()) + i) % 90 + 1 for i in range(num_prompt)]
    request = Request(
        req_id,
        prompt,
        SamplingParams(temperature=0.0, max_tokens=max_tokens),
        eos_token_id=EOS,
        arrival_time=0.0,
        block_hasher=scheduler.kv.block_hasher,
        max_model_len=MAX_LEN,
    )
    scheduler.add_request(request)
    return request


class FakeWorker:
    """Runs each step as it is started, in order, like the one worker of an engine."""

    def __init__(self) -> None:
        self.tokens: dict[str, list[int]] = {}
        self.steps_run = 0

    def run(self, so: SchedulerOutput) -> ModelRunnerOutput:
        for req_id in so.finished_req_ids:
            self.tokens.pop(req_id, None)
        starts = {new.req_id: new.num_computed_tokens for new in so.scheduled_new_reqs}
        for new in so.scheduled_new_reqs:
            self.tokens[new.req_id] = list(new.prompt_token_ids)
        cached = so.scheduled_cached_reqs
        starts.update(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
        req_ids = list(so.num_scheduled_tokens)
        sampled = []
        for req_id in req_ids:
            tokens = self.tokens[req_id]
            end = starts[req_id] + so.num_scheduled_tokens[req_id]
            assert end <= len(tokens), f"{req_id}: computes past the tokens it has"
            sampled.append([self._next(tokens)] if end == len(tokens) else [])
            tokens.extend(sampled[-1])
        self.steps_run += 1
        return ModelRunnerOutput(req_ids=req_ids, sampled_token_ids=sampled)

    @staticmethod
    def _next(tokens: list[int]) -> int:
        """A token that depends on the whole context; EOS about once in 23."""
        return (31 * sum(tokens) + 7 * len(tokens)) % 23


def run(scheduler: Scheduler, in_flight: int) -> dict[str, tuple[list[int], str]]:
    """Drive the scheduler with up to `in_flight` steps started before the oldest one's
    output is applied, as the engine core does; each request's (tokens, finish reason)."""
    worker, queue, results = FakeWorker(), deque(), {}
    while scheduler.has_unfinished_requests() or queue:
        so = scheduler.schedule()
        if so.total_num_scheduled_tokens:
            queue.append((so, worker.run(so)))
        if queue and (len(queue) == in_flight or not so.total_num_scheduled_tokens):
            done, output = queue.popleft()
            for out in scheduler.update_from_output(done, output).outputs:
                tokens, _ = results.get(out.request_id, ([], None))
                reason = None if out.finish_reason is None else str(out.finish_reason)
                results[out.request_id] = (tokens + out.new_token_ids, reason)
    assert all(reason is not None for _, reason in results.values())
    return results


def add_batch(scheduler: Scheduler) -> None:
    for i in range(10):
        add(scheduler, f"r{i}", num_prompt=3 + 5 * i % 17, max_tokens=1 + 7 * i % 20)


def test_async_scheduling_ends_every_request_as_one_step_at_a_time_does():
    outputs = {}
    for async_scheduling, in_flight in ((False, 1), (True, 2)):
        scheduler = make_scheduler(async_scheduling, max_num_batched_tokens=16, max_num_seqs=6)
        add_batch(scheduler)
        outputs[async_scheduling] = run(scheduler, in_flight)
        assert free_blocks(scheduler) == 63  # nothing leaked
    assert outputs[True] == outputs[False]
    reasons = {reason for _, reason in outputs[True].values()}
    assert reasons == {"stop", "length"}  # EOS and max_tokens both end requests


def test_under_preemption_too():
    outputs, preemptions = {}, {}
    for async_scheduling, in_flight in ((False, 1), (True, 2)):
        # 12 blocks of 4 tokens: far less than 6 running requests of up to 40 tokens need.
        scheduler = make_scheduler(async_scheduling, num_blocks=13, max_num_seqs=6)
        add_batch(scheduler)
        outputs[async_scheduling] = run(scheduler, in_flight)
        preemptions[async_scheduling] = scheduler.num_preemptions
        assert free_blocks(scheduler) == 12
    assert preemptions[True] > 0 and preemptions[False] > 0
    assert outputs[True] == outputs[False]


def test_a_decode_is_scheduled_again_before_its_token_is_known():
    scheduler = make_scheduler(True)
    request = add(scheduler, "r", num_prompt=5, max_tokens=10)
    first = scheduler.schedule()  # the prompt: samples the first token
    second = scheduler.schedule()  # the first token's position, before it is known
    assert first.num_scheduled_tokens == {"r": 5} and second.num_scheduled_tokens == {"r": 1}
    assert request.num_output_placeholders == 2
    worker = FakeWorker()
    scheduler.update_from_output(first, worker.run(first))
    assert request.num_output_tokens == 1 and request.num_output_placeholders == 1
    scheduler.update_from_output(second, worker.run(second))
    assert request.num_output_tokens == 2 and request.num_output_placeholders == 0


def test_no_step_computes_past_a_requests_last_token():
    scheduler = make_scheduler(True)
    add(scheduler, "one", num_prompt=5, max_tokens=1)
    add(scheduler, "two", num_prompt=5, max_tokens=2)
    scheduler.schedule()
    # "one" ends with the token its prefill samples; "two" computes that token once.
    assert scheduler.schedule().num_scheduled_tokens == {"two": 1}
    assert scheduler.schedule().num_scheduled_tokens == {}


def test_a_step_finishing_a_request_while_the_next_one_runs_drops_its_extra_token():
    scheduler = make_scheduler(True)
    request = add(scheduler, "r", num_prompt=4, max_tokens=10)
    worker = FakeWorker()
    first, second = scheduler.schedule(), scheduler.schedule()
    output = worker.run(first)
    output.sampled_token_ids = [[EOS]]  # the first token ends it
    finished = scheduler.update_from_output(first, output).outputs
    assert [(o.new_token_ids, str(o.finish_reason)) for o in finished] == [([EOS], "stop")]
    # The step already running computed past it: its token is not the request's.
    assert scheduler.update_from_output(second, worker.run(second)).outputs == []
    assert request.output_token_ids == [EOS]
    assert free_blocks(scheduler) == 63
    assert scheduler.schedule().finished_req_ids == {"r"}


def test_a_request_aborted_while_its_steps_run_frees_its_blocks_once():
    scheduler = make_scheduler(True)
    add(scheduler, "r", num_prompt=9, max_tokens=10)
    worker = FakeWorker()
    first, second = scheduler.schedule(), scheduler.schedule()
    scheduler.finish_requests(["r"], RequestStatus.FINISHED_ABORTED)
    assert free_blocks(scheduler) == 63
    for so in (first, second):
        assert scheduler.update_from_output(so, worker.run(so)).outputs == []
    assert free_blocks(scheduler) == 63
    assert not scheduler.has_unfinished_requests()


def test_a_request_preempted_while_the_step_that_ends_it_runs_leaves_the_waiting_queue():
    scheduler = make_scheduler(True, num_blocks=5)  # 4 blocks of 4 tokens
    first_in = add(scheduler, "b", num_prompt=8, max_tokens=6)
    last_in = add(scheduler, "a", num_prompt=8, max_tokens=1)
    worker = FakeWorker()
    first = scheduler.schedule()  # both prompts: every block
    # b's next position needs a fifth block: a, the last running, is preempted while the
    # step that samples its only token runs.
    second = scheduler.schedule()
    assert last_in.status == RequestStatus.PREEMPTED
    assert second.num_scheduled_tokens == {"b": 1}
    outputs = scheduler.update_from_output(first, worker.run(first)).outputs
    finished = {o.request_id: (len(o.new_token_ids), o.finish_reason) for o in outputs}
    assert finished == {"b": (1, None), "a": (1, FinishReason.LENGTH)}
    assert len(scheduler.waiting) == 0 and "a" not in scheduler.requests
    scheduler.update_from_output(second, worker.run(second))
    while scheduler.has_unfinished_requests():
        so = scheduler.schedule()
        scheduler.update_from_output(so, worker.run(so))
    assert first_in.num_output_tokens == 6
    assert free_blocks(scheduler) == 4


def test_a_running_steps_output_never_reaches_a_new_request_given_the_same_id():
    scheduler = make_scheduler(True)
    add(scheduler, "r", num_prompt=6, max_tokens=10)
    worker = FakeWorker()
    first, second = scheduler.schedule(), scheduler.schedule()
    first_output, second_output = worker.run(first), worker.run(second)
    scheduler.finish_requests(["r"], RequestStatus.FINISHED_ABORTED)
    again = add(scheduler, "r", num_prompt=3, max_tokens=10)  # a client reusing the id
    assert scheduler.update_from_output(first, first_output).outputs == []
    assert scheduler.update_from_output(second, second_output).outputs == []
    assert again.num_output_tokens == 0 and again.status == RequestStatus.WAITING


def test_a_pooled_request_preempted_while_its_step_runs_still_finishes_with_its_vector():
    scheduler = make_scheduler(True, num_blocks=5)  # 4 blocks of 4 tokens
    add(scheduler, "b", num_prompt=8, max_tokens=6)
    pooled = Request("p", list(range(1, 9)), None, eos_token_id=EOS, arrival_time=0.0,
                     block_hasher=scheduler.kv.block_hasher, max_model_len=MAX_LEN,
                     pooling_params=PoolingParams())  # fmt: skip
    scheduler.add_request(pooled)
    worker = FakeWorker()
    first = scheduler.schedule()  # both prompts: every block
    second = scheduler.schedule()  # b's next position preempts "p" while its step runs
    assert pooled.status == RequestStatus.PREEMPTED
    output = worker.run(first)
    output.sampled_token_ids[output.req_ids.index("p")] = []
    output.pooler_output = {"p": [0.5, 0.25]}
    outputs = scheduler.update_from_output(first, output).outputs
    assert [o.pooling_output for o in outputs if o.request_id == "p"] == [[0.5, 0.25]]
    assert len(scheduler.waiting) == 0 and "p" not in scheduler.requests
    scheduler.update_from_output(second, worker.run(second))
