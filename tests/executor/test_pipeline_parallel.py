"""Pipeline parallelism over worker processes: stages of decoder layers, hidden states
sent stage to stage, the last stage's tokens broadcast back to the others.

The tiny TP llama generates the same greedy tokens with 2 stages and with 2 stages x 2
tensor-parallel ranks as with one worker; the default model (GGUF, 30 layers, tied head:
the last stage holds the embedding too) with 2 stages as with one.
"""

from __future__ import annotations

import pytest
from determinism import assert_greedy_equivalent
from test_multiproc_executor import children, engine, generate
from tp_checkpoint import write_tp_checkpoint

from core import LLM, SamplingParams

pytestmark = pytest.mark.slow  # about 60 s: 2 to 4 worker processes per engine


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tp_checkpoint(tmp_path_factory.mktemp("pp"))


@pytest.fixture(scope="module")
def one_rank(model_dir) -> list[list[int]]:
    return generate(engine(model_dir))


@pytest.mark.parametrize(("pp", "tp"), [(2, 1), (2, 2)])
def test_pipeline_stages_generate_what_one_worker_does(model_dir, one_rank, pp, tp) -> None:
    llm = engine(model_dir, pipeline_parallel_size=pp, tensor_parallel_size=tp)
    core = llm.engine.core
    assert len(core.executor.workers) == pp * tp
    in_flight: list[int] = []
    start = core.executor.execute_model_async

    def counted(scheduler_output):
        in_flight.append(len(core.batch_queue) + 1)
        return start(scheduler_output)

    core.executor.execute_model_async = counted
    assert generate(llm) == one_rank
    assert max(in_flight) == pp  # the stages worked on different steps at once
    assert not children()


DEFAULT_PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
DEFAULT_GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)


def default_model(llm: LLM) -> list[list[int]]:
    outputs = llm.generate(DEFAULT_PROMPTS, DEFAULT_GREEDY, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outputs]


@pytest.fixture(scope="module")
def whole():
    """The default model dequantized in one worker: its outputs, and the engine, whose
    logprobs judge a divergence (DESIGN.md's near-tie rule: logprobs differ from logits
    by one constant per position, so their top-2 gap is the logits')."""
    llm = LLM(None, max_model_len=256, dtype="float32", quantization="none", max_logprobs=20)
    yield default_model(llm), llm
    llm.engine.shutdown()


def test_the_default_model_in_two_stages_generates_what_it_does_whole(whole) -> None:
    want, reference = whole
    llm = LLM(
        None, max_model_len=256, dtype="float32", quantization="none", pipeline_parallel_size=2
    )
    try:
        ours = default_model(llm)
    finally:
        llm.engine.shutdown()
    prompts = [reference.get_tokenizer().encode(p) for p in DEFAULT_PROMPTS]
    for got, expected, prompt in zip(ours, want, prompts, strict=True):
        assert_greedy_equivalent(got, expected, lambda t: _top_logprobs(reference, t), prompt)
    assert not children()


def _top_logprobs(llm: LLM, tokens: list[int]):
    """The next token's top-20 logprobs after `tokens` ([V]; the rest set to the 20th, so
    the scale the near-tie rule takes is the largest magnitude among them)."""
    import torch

    params = SamplingParams(temperature=0.0, max_tokens=1, logprobs=20)
    (output,) = llm.generate([{"prompt_token_ids": tokens}], params, use_tqdm=False)
    top = {t: lp.logprob for t, lp in output.outputs[0].logprobs[0].items()}
    scores = torch.full((llm.engine.processor.vocab_size,), min(top.values()))
    scores[list(top)] = torch.tensor(list(top.values()))
    return scores
