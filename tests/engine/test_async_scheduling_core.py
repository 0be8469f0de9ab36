"""The engine core under --async-scheduling, on the tiny random model: the worker runs on
a thread of its own, each step's output is applied while the next step is already
started, step times reach the measured budget, and every request ends as it does one
step at a time (greedy and seeded, under preemption)."""

from __future__ import annotations

import threading

from tiny_engine_checkpoint import VOCAB, engine_args

from core.engine.llm_engine import LLMEngine
from core.sampling_params import SamplingParams

PROMPTS = {f"r{i}": [VOCAB[f"w{(5 * i + j) % 40}"] for j in range(3 + 4 * i)] for i in range(6)}


def params(i: int) -> SamplingParams:
    if i % 3 == 2:
        return SamplingParams(temperature=0.9, seed=i, max_tokens=6 + i)
    return SamplingParams(temperature=0.0, max_tokens=4 + 3 * i, ignore_eos=i % 2 == 0)


def run(engine: LLMEngine) -> dict[str, tuple[list[int], str]]:
    for i, (req_id, prompt) in enumerate(PROMPTS.items()):
        engine.add_request(req_id, prompt, params(i))
    finished = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                completion = output.outputs[0]
                finished[output.request_id] = (completion.token_ids, completion.finish_reason)
    return finished


def test_steps_overlap_and_requests_end_as_one_step_at_a_time(tiny_checkpoint):
    # 6 blocks of 16 tokens (4 KiB each) and a few tokens a step: chunked prompts,
    # decodes beside them, preemption.
    settings = dict(max_num_seqs=6, max_num_batched_tokens=12, kv_cache_memory="24KiB")
    sync_engine = LLMEngine(engine_args(tiny_checkpoint, **settings))
    try:
        expected = run(sync_engine)
    finally:
        sync_engine.shutdown()
    engine = LLMEngine(engine_args(tiny_checkpoint, async_scheduling=True, **settings))
    core = engine.core
    threads, ahead = set(), []
    execute, update = core.executor.worker.execute_model, core.scheduler.update_from_output

    def execute_model(scheduler_output):
        threads.add(threading.current_thread().name)
        return execute(scheduler_output)

    def update_from_output(scheduler_output, runner_output):
        ahead.append(len(core.batch_queue))  # steps started after this one
        assert runner_output.execute_seconds > 0  # the worker timed the step itself
        return update(scheduler_output, runner_output)

    core.executor.worker.execute_model = execute_model
    core.scheduler.update_from_output = update_from_output
    try:
        assert run(engine) == expected
        assert core.scheduler.num_preemptions > 0
    finally:
        engine.shutdown()
    assert len(threads) == 1 and threading.main_thread().name not in threads
    assert max(ahead) == 1 and ahead.count(1) > len(ahead) // 2
