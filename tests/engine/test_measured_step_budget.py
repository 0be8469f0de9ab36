"""Measured step budgets in an engine: the engine core seeds them at start and feeds them
each step's time, and a step sized past max_num_batched_tokens is held by the model
runner (its buffers are sized by SchedulerConfig.max_step_tokens) and computed right."""

from __future__ import annotations

from determinism import assert_greedy_equivalent
from tiny_engine_checkpoint import (
    VOCAB,
    engine_args,
    greedy_reference,
    next_token_logits,
    reference_model,
)

from core.engine.llm_engine import LLMEngine
from core.sampling_params import SamplingParams
from core.scheduler.step_budget import StepCost

PROMPTS = {
    f"r{i}": [VOCAB[f"w{(3 * i + j) % 10}"] for j in range(6 + 2 * i)] for i in range(4)
}  # 6-12 tokens each: 36 in all, over four times the step budget


def test_a_measured_step_past_the_step_budget_matches_transformers(tiny_checkpoint):
    args = engine_args(
        tiny_checkpoint, max_num_batched_tokens=8, max_num_seqs=8, burst_token_budget=64
    )
    engine = LLMEngine(args)
    try:
        # A fit in which a step's fixed cost is worth 10 tokens: the wave's first step
        # may take nine times that, all four prompts' quarters (9 tokens) and more.
        cost = engine.core.scheduler.budget.cost = StepCost()
        for num_tokens in (1, 64):
            cost.observe(num_tokens, 0.01 + 0.001 * num_tokens)
        params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
        for req_id, prompt in PROMPTS.items():
            engine.add_request(req_id, prompt, params)
        engine.step()
        requests = engine.core.scheduler.requests
        assert sum(requests[r].num_computed_tokens for r in PROMPTS) > 8
        finished = {}
        while engine.has_unfinished_requests():
            for output in engine.step():
                if output.finished:
                    finished[output.request_id] = output.outputs[0].token_ids
    finally:
        engine.shutdown()
    model = reference_model()
    for req_id, prompt in PROMPTS.items():
        assert_greedy_equivalent(
            finished[req_id],
            greedy_reference(model, prompt, 4),
            lambda c: next_token_logits(model, c),
            prompt,
            req_id,
        )


def test_the_engine_core_times_dummy_steps_at_start_and_every_step_after(tiny_checkpoint):
    engine = LLMEngine(engine_args(tiny_checkpoint, max_num_batched_tokens=8,
                                   burst_token_budget=64))  # fmt: skip
    try:
        cost = engine.core.scheduler.budget.cost
        # The dummy forwards of 1 token and of 64 (what a step holds, under 128).
        seeded = dict(cost._groups)
        assert sorted(seeded) == [(1).bit_length(), (64).bit_length()]
        # 12 prompt tokens: steps of 4 to 15 tokens, groups the dummy forwards left empty.
        engine.add_request("r", PROMPTS["r3"], SamplingParams(max_tokens=2, ignore_eos=True))
        while engine.has_unfinished_requests():
            engine.step()
        assert set(cost._groups) - set(seeded)
        assert cost._groups[1] != seeded[1]  # the decode step moved the 1-token group
    finally:
        engine.shutdown()


def test_a_fixed_step_budget_times_nothing_at_start(tiny_checkpoint, monkeypatch):
    from core.worker.worker import Worker

    calls = []
    monkeypatch.setattr(Worker, "dummy_run", lambda self, n: calls.append(n))
    engine = LLMEngine(engine_args(tiny_checkpoint, max_num_batched_tokens=8))
    engine.shutdown()
    assert calls == []
