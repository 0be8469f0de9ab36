"""Request: built from an EngineCoreRequest, token bookkeeping, statuses and finish reasons."""

from __future__ import annotations

import pytest

from core.engine.protocol import EngineCoreRequest
from core.kv_cache.block_hash import make_block_hasher
from core.lora.request import LoRARequest
from core.request import FinishReason, Request, RequestStatus
from core.sampling_params import SamplingParams


def engine_request(max_tokens: int | None = 16, prompt=(1, 2, 3, 4, 5)) -> EngineCoreRequest:
    return EngineCoreRequest(
        request_id="req-0",
        prompt_token_ids=list(prompt),
        sampling_params=SamplingParams(max_tokens=max_tokens),
        eos_token_id=2,
        arrival_time=12.5,
        priority=3,
        cache_salt="salt",
        lora_request=LoRARequest("adapter", 1, "/adapters/a"),
    )


def test_from_engine_core_request_copies_fields_and_starts_waiting():
    req = Request.from_engine_core_request(engine_request(), make_block_hasher(4))
    assert (req.request_id, req.prompt_token_ids, req.eos_token_id) == ("req-0", [1, 2, 3, 4, 5], 2)
    assert (req.arrival_time, req.priority, req.cache_salt, req.lora_name) == (
        12.5,
        3,
        "salt",
        "adapter",
    )
    assert req.status is RequestStatus.WAITING
    assert (req.num_prompt_tokens, req.num_tokens, req.num_output_tokens) == (5, 5, 0)
    assert (req.num_computed_tokens, req.num_cached_tokens, req.num_preemptions) == (0, -1, 0)
    assert len(req.block_hashes) == 1  # one full block of 4 among 5 tokens
    assert req.get_finished_reason() is None and not req.is_finished


def test_appending_output_tokens_extends_all_token_ids_and_block_hashes():
    req = Request.from_engine_core_request(engine_request(), make_block_hasher(4))
    req.append_output_token_ids(6)
    req.append_output_token_ids([7, 8])
    assert req.output_token_ids == [6, 7, 8]
    assert req.all_token_ids == [1, 2, 3, 4, 5, 6, 7, 8]
    assert req.num_tokens == 8 and len(req.block_hashes) == 2


def test_without_a_block_hasher_no_hashes_are_kept():
    req = Request.from_engine_core_request(engine_request())
    req.append_output_token_ids([6, 7, 8])
    assert req.block_hashes == []


def test_max_tokens_is_resolved_against_max_model_len():
    assert Request.from_engine_core_request(engine_request(16)).max_tokens == 16
    assert Request.from_engine_core_request(engine_request(16), max_model_len=10).max_tokens == 5
    assert Request.from_engine_core_request(engine_request(3), max_model_len=10).max_tokens == 3
    assert Request.from_engine_core_request(engine_request(None), max_model_len=10).max_tokens == 5


def test_unresolvable_max_tokens_are_value_errors():
    with pytest.raises(ValueError, match="max_model_len unknown"):
        Request.from_engine_core_request(engine_request(None))
    with pytest.raises(ValueError, match="no room to generate under max_model_len 5"):
        Request.from_engine_core_request(engine_request(4), max_model_len=5)
    with pytest.raises(ValueError, match="prompt_token_ids must not be empty"):
        Request.from_engine_core_request(engine_request(prompt=()))


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        (RequestStatus.FINISHED_STOPPED, FinishReason.STOP),
        (RequestStatus.FINISHED_LENGTH_CAPPED, FinishReason.LENGTH),
        (RequestStatus.FINISHED_ABORTED, FinishReason.ABORT),
        (RequestStatus.FINISHED_ERROR, FinishReason.ERROR),
    ],
)
def test_finished_statuses_map_to_finish_reasons(status, reason):
    req = Request.from_engine_core_request(engine_request())
    req.status = status
    assert status.is_finished() and req.is_finished
    assert req.get_finished_reason() is reason


@pytest.mark.parametrize(
    "status",
    [
        RequestStatus.WAITING,
        RequestStatus.WAITING_FOR_REMOTE_KVS,
        RequestStatus.WAITING_FOR_GRAMMAR,
        RequestStatus.RUNNING,
        RequestStatus.PREEMPTED,
    ],
)
def test_unfinished_statuses_have_no_finish_reason(status):
    assert not status.is_finished()
    assert status.finish_reason() is None
