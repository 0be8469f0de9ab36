"""A burst step schedules more tokens than the step budget: the model runner must hold them
(its buffers are sized by SchedulerConfig.max_step_tokens) and compute them right."""

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

PROMPTS = {
    f"r{i}": [VOCAB[f"w{(3 * i + j) % 10}"] for j in range(6 + 2 * i)] for i in range(4)
}  # 6-12 tokens each: 36 in all, over four times the step budget


def test_a_burst_is_prefilled_in_one_step_past_the_budget_and_matches_transformers(
    tiny_checkpoint,
):
    args = engine_args(
        tiny_checkpoint, max_num_batched_tokens=8, max_num_seqs=8, burst_token_budget=64
    )
    engine = LLMEngine(args)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
        for req_id, prompt in PROMPTS.items():
            engine.add_request(req_id, prompt, params)
        engine.step()  # nothing running, four waiting: one step prefills all of them
        requests = engine.core.scheduler.requests
        assert {r: requests[r].num_output_tokens for r in PROMPTS} == dict.fromkeys(PROMPTS, 1)
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
