"""LLMEngine drives the in-process engine core through its client: greedy parity with
transformers, and a stop string found in the frontend aborts the engine core's request."""

from __future__ import annotations

import pytest
from determinism import assert_greedy_equivalent
from tiny_engine_checkpoint import (
    VOCAB,
    engine_args,
    greedy_reference,
    next_token_logits,
    reference_model,
)

from core.engine.core_client import InprocClient
from core.engine.llm_engine import LLMEngine
from core.sampling_params import SamplingParams

PROMPT = [VOCAB[w] for w in ("w0", "w1", "w2", "w3", "w4")]


@pytest.fixture(scope="module")
def engine(tiny_checkpoint) -> LLMEngine:
    engine = LLMEngine(engine_args(tiny_checkpoint))
    yield engine
    engine.shutdown()


def run_to_completion(engine: LLMEngine) -> dict:
    finished = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = output.outputs[0]
    return finished


def test_llm_engine_generates_the_reference_greedy_tokens_through_its_client(engine):
    assert isinstance(engine.client, InprocClient) and engine.core is engine.client.core
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    engine.add_request("greedy", PROMPT, params)
    completion = run_to_completion(engine)["greedy"]
    model = reference_model()
    reference = greedy_reference(model, PROMPT, 8)
    assert_greedy_equivalent(
        completion.token_ids, reference, lambda c: next_token_logits(model, c), PROMPT, "greedy"
    )
    assert (len(completion.token_ids), completion.finish_reason) == (8, "length")


def test_a_stop_string_ends_the_request_in_the_engine_core_too(engine):
    words = {i: w for w, i in VOCAB.items()}
    reference = [words[t] for t in greedy_reference(reference_model(), PROMPT, 8)]
    stop = next(w for w in reference[1:] if w.startswith("w"))  # a plain word, not the first
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, stop=[stop])
    engine.add_request("stopped", PROMPT, params)
    completion = run_to_completion(engine)["stopped"]
    assert (completion.finish_reason, completion.stop_reason) == ("stop", stop)
    assert len(completion.token_ids) < 20
    # The frontend found the stop string; the engine core was told to drop the request
    # rather than run it on to max_tokens.
    assert not engine.core.has_unfinished_requests()
