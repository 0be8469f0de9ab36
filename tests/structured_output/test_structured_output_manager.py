"""StructuredOutputManager: compiles off the caller's thread, bitmask rows in order, and a
batched greedy loop through the manager and the worker-side mask."""

from __future__ import annotations

import re
import threading
import time

import pytest
import torch

from core.sampling_params import StructuredOutputsParams
from core.structured_output import StructuredOutputManager
from core.structured_output.xgrammar_backend import Grammar, XgrammarBackend
from core.worker.grammar_bitmask import (
    allowed_token_mask,
    apply_grammar_bitmask,
    grammar_bitmask_tensor,
)

BIG_SCHEMA = {
    "type": "object",
    "properties": {f"field_{i}": {"type": "array", "items": {"type": "number"}} for i in range(40)},
}


class GatedBackend:
    """The real backend, except that compiling BIG_SCHEMA waits until `gate` opens: a
    compile as slow as the test wants, deterministically."""

    def __init__(self, backend: XgrammarBackend) -> None:
        self.backend = backend
        self.gate = threading.Event()
        self.num_built = 0

    def compile(self, params: StructuredOutputsParams) -> Grammar:
        if params.json == BIG_SCHEMA and not self.gate.wait(timeout=30):
            raise TimeoutError("the test never opened the gate")
        return self.backend.compile(params)

    def allocate_bitmask(self, num_rows: int) -> torch.Tensor:
        return self.backend.allocate_bitmask(num_rows)


@pytest.fixture
def gated(smollm2_backend) -> GatedBackend:
    return GatedBackend(smollm2_backend)


@pytest.fixture
def manager(gated):
    def make_backend() -> GatedBackend:
        gated.num_built += 1
        return gated

    manager = StructuredOutputManager(make_backend, max_workers=2)
    yield manager
    gated.gate.set()
    manager.shutdown()


def _wait_ready(manager: StructuredOutputManager, request_id: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not manager.is_ready(request_id):
        if time.monotonic() > deadline:
            raise AssertionError(f"{request_id} not ready after {timeout} s")
        manager.wait(0.05)


def _single_token(tokenizer, text: str) -> int:
    (token_id,) = tokenizer.encode(text, add_special_tokens=False)
    return token_id


# --- compiling ------------------------------------------------------------------------------


def test_submit_returns_before_the_compile_and_is_ready_after(manager, gated):
    manager.submit("big", StructuredOutputsParams(json=BIG_SCHEMA))
    assert not manager.is_ready("big") and manager.error("big") is None
    assert not manager.wait(0.05)  # still gated
    gated.gate.set()
    _wait_ready(manager, "big")
    assert manager.error("big") is None


def test_a_slow_compile_does_not_hold_back_a_quick_one(manager, gated):
    manager.submit("big", StructuredOutputsParams(json=BIG_SCHEMA))
    manager.submit("tiny", StructuredOutputsParams(regex="[0-9]+"))
    _wait_ready(manager, "tiny")
    assert not manager.is_ready("big")
    assert manager.build_bitmask(["tiny"]) is not None
    gated.gate.set()
    _wait_ready(manager, "big")


def test_failed_compile_is_ready_with_its_reason(manager):
    manager.submit("bad", StructuredOutputsParams(regex="(abc"))
    _wait_ready(manager, "bad")
    assert re.match(r"invalid structured_outputs\.regex: .*not closed", manager.error("bad"))
    with pytest.raises(ValueError, match="'bad': invalid structured_outputs.regex"):
        manager.build_bitmask(["bad"])
    with pytest.raises(ValueError, match="'bad'"):
        manager.accept_tokens("bad", [0])


def test_a_backend_that_cannot_be_built_fails_each_request_with_the_reason(smollm2_tokenizer):
    manager = StructuredOutputManager.from_tokenizer(smollm2_tokenizer, 49152, stop_token_ids=[])
    manager.submit("r", StructuredOutputsParams(regex="a"))
    _wait_ready(manager, "r")
    manager.shutdown()
    assert "stop_token_ids must not be empty" in manager.error("r")


def test_the_backend_is_built_once_on_the_first_compile(manager, gated):
    assert gated.num_built == 0
    manager.submit("a", StructuredOutputsParams(regex="a"))
    manager.submit("b", StructuredOutputsParams(regex="b"))
    _wait_ready(manager, "a")
    _wait_ready(manager, "b")
    assert gated.num_built == 1


def test_a_grammar_still_compiling_cannot_build_a_bitmask(manager):
    manager.submit("big", StructuredOutputsParams(json=BIG_SCHEMA))
    with pytest.raises(ValueError, match="still compiling"):
        manager.build_bitmask(["big"])


# --- per request state ----------------------------------------------------------------------


def test_bitmask_rows_follow_the_given_order_and_skip_requests_without_grammar(
    manager, smollm2_tokenizer
):
    for letter in "abc":
        manager.submit(f"r_{letter}", StructuredOutputsParams(regex=letter))
        _wait_ready(manager, f"r_{letter}")
    assert manager.build_bitmask(["plain"]) is None
    bitmask = manager.build_bitmask(["r_c", "plain", "r_a"])
    assert bitmask.req_ids == ["r_c", "r_a"] and bitmask.words_per_row == 1536
    allowed = allowed_token_mask(grammar_bitmask_tensor(bitmask), 49152)
    assert allowed[0].nonzero().flatten().tolist() == [_single_token(smollm2_tokenizer, "c")]
    assert allowed[1].nonzero().flatten().tolist() == [_single_token(smollm2_tokenizer, "a")]


def test_accepted_tokens_advance_the_request_to_termination(manager, smollm2_tokenizer):
    manager.submit("r", StructuredOutputsParams(choice=["yes", "no"]))
    _wait_ready(manager, "r")
    assert not manager.accept_tokens("r", [_single_token(smollm2_tokenizer, "maybe")])
    assert manager.accept_tokens("r", smollm2_tokenizer.encode("no", add_special_tokens=False))
    assert not manager.is_terminated("r")
    assert manager.accept_tokens("r", [smollm2_tokenizer.eos_token_id])
    assert manager.is_terminated("r")


def test_remove_forgets_the_request(manager):
    manager.submit("r", StructuredOutputsParams(regex="a"))
    _wait_ready(manager, "r")
    manager.remove("r")
    manager.remove("never-submitted")
    assert "r" not in manager and manager.build_bitmask(["r"]) is None
    with pytest.raises(ValueError, match="has no grammar"):
        manager.is_ready("r")
    manager.submit("r", StructuredOutputsParams(regex="b"))  # the id may be reused


def test_submitting_twice_for_one_request_raises(manager):
    manager.submit("r", StructuredOutputsParams(regex="a"))
    with pytest.raises(ValueError, match="already has a grammar"):
        manager.submit("r", StructuredOutputsParams(regex="a"))


def test_wait_returns_at_once_with_nothing_compiling(manager):
    assert manager.wait(10.0) is False


# --- the step loop --------------------------------------------------------------------------


def test_batched_greedy_decoding_through_the_manager(smollm2_tokenizer):
    """Three requests sample together, two constrained: the scheduler side builds the
    bitmask, the worker side masks the batch's logits, the scheduler side accepts."""
    manager = StructuredOutputManager.from_tokenizer(smollm2_tokenizer, 49152)
    choices = ["red", "green", "blue", "light grey"]
    manager.submit("choice", StructuredOutputsParams(choice=choices))
    manager.submit("regex", StructuredOutputsParams(regex=r"[0-9]{2,4}-[a-z]{3}"))
    for request_id in ("choice", "regex"):
        _wait_ready(manager, request_id)
    eos = smollm2_tokenizer.eos_token_id
    outputs: dict[str, list[int]] = {"choice": [], "regex": [], "plain": []}
    generator = torch.Generator().manual_seed(0)
    running = ["choice", "plain", "regex"]
    for _ in range(40):
        logits = torch.randn(len(running), 49152, generator=generator)  # [N, V]
        bitmask = manager.build_bitmask(running)
        apply_grammar_bitmask(logits, running, bitmask)
        for request_id, token_id in zip(list(running), logits.argmax(-1).tolist(), strict=True):
            if request_id in manager:
                assert manager.accept_tokens(request_id, [token_id])
                if manager.is_terminated(request_id):
                    manager.remove(request_id)
                    running.remove(request_id)
                    continue
            outputs[request_id].append(token_id)
        if running == ["plain"]:
            break
    manager.shutdown()
    assert running == ["plain"]
    assert eos not in outputs["choice"] + outputs["regex"]
    assert smollm2_tokenizer.decode(outputs["choice"]) in choices
    assert re.fullmatch(r"[0-9]{2,4}-[a-z]{3}", smollm2_tokenizer.decode(outputs["regex"]))
