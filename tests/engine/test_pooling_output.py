"""PoolingOutputProcessor on hand-made engine-core outputs: one final EmbeddingRequestOutput
per request, aborts that wake their waiter, and the stats a pooled request reports."""

from __future__ import annotations

import queue

import pytest

from core.engine.pooling_output import PoolingOutputProcessor
from core.engine.protocol import (
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    FinishReason,
)
from core.engine.stats import IterationStats
from core.pooling.params import PoolingParams
from core.sampling_params import SamplingParams

PROMPT = [5, 6, 7]


def pooled_request(request_id: str) -> EngineCoreRequest:
    return EngineCoreRequest(
        request_id=request_id,
        prompt_token_ids=PROMPT,
        sampling_params=None,
        eos_token_id=None,
        arrival_time=0.0,
        pooling_params=PoolingParams(),
    )


def finished(request_id: str, vector: list[float]) -> EngineCoreOutput:
    return EngineCoreOutput(
        request_id=request_id,
        new_token_ids=[],
        finish_reason=FinishReason.STOP,
        pooling_output=vector,
        num_cached_tokens=1,
    )


def test_a_finished_request_gives_its_vector_once():
    processor = PoolingOutputProcessor()
    processor.add_request(pooled_request("a"), prompt="w1 w2")
    result = processor.process_outputs(EngineCoreOutputs(outputs=[finished("a", [0.6, 0.8])]))
    (output,) = result.request_outputs
    assert (output.request_id, output.prompt, output.prompt_token_ids) == ("a", "w1 w2", PROMPT)
    assert output.finished and output.outputs.embedding == [0.6, 0.8]
    assert not processor.has_unfinished_requests()
    repeated = processor.process_outputs(EngineCoreOutputs(outputs=[finished("a", [1.0, 0.0])]))
    assert repeated.request_outputs == []


def test_only_pooled_requests_and_fresh_ids_are_taken():
    processor = PoolingOutputProcessor()
    sampled = EngineCoreRequest(
        request_id="s", prompt_token_ids=PROMPT, sampling_params=SamplingParams(),
        eos_token_id=None, arrival_time=0.0,
    )  # fmt: skip
    with pytest.raises(ValueError, match="request 's' has no pooling_params"):
        processor.add_request(sampled)
    processor.add_request(pooled_request("a"))
    with pytest.raises(ValueError, match="request_id 'a' is already in use"):
        processor.add_request(pooled_request("a"))


def test_aborted_requests_wake_their_waiter_without_a_vector():
    processor = PoolingOutputProcessor()
    waiting: queue.Queue = queue.Queue()
    processor.add_request(pooled_request("a"), queue=waiting)
    processor.add_request(pooled_request("b"))
    assert processor.abort_requests(["a", "unknown"]) == ["a"]
    assert waiting.get_nowait().outputs is None
    (ended,) = processor.process_outputs(EngineCoreOutputs(finished_requests={"b"})).request_outputs
    assert ended.request_id == "b" and ended.outputs is None


def test_a_pooled_request_reports_its_prompt_tokens_and_its_finish():
    seen: list[IterationStats] = []
    processor = PoolingOutputProcessor(seen.append)
    processor.add_request(pooled_request("a"))
    processor.process_outputs(EngineCoreOutputs(outputs=[finished("a", [1.0])]))
    (stats,) = seen
    assert (stats.num_prompt_tokens, stats.num_cached_prompt_tokens) == (3, 1)
    assert stats.num_generation_tokens == 0
    (request,) = stats.finished_requests
    assert (request.finish_reason, request.num_prompt_tokens) == (FinishReason.STOP, 3)
