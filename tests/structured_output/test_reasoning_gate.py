"""With a reasoning parser, a grammar constrains only the tokens after the reasoning: every
token is allowed while the model reasons, the grammar starts at the token after the end,
and drafts that cross the end are checked and masked from there, without moving it."""

from __future__ import annotations

import time

import pytest
import torch

from core.sampling_params import StructuredOutputsParams
from core.structured_output import StructuredOutputManager
from core.structured_output.reasoning_gate import ReasoningGate
from core.worker.grammar_bitmask import grammar_bitmask_tensor

# SmolLM2's <repo_name> and <|im_start|> stand in for <think> and </think>: special tokens,
# which no grammar allows.
START, END = 3, 1
ANSWER = StructuredOutputsParams(regex="42")


def is_reasoning_end(token_ids) -> bool:
    """The think-tag rule: the last marker decides."""
    for token_id in reversed(token_ids):
        if token_id in (START, END):
            return token_id == END
    return False


def test_the_gate_finds_the_end_in_a_run_and_moves_past_it_only_on_advance():
    gate = ReasoningGate(is_reasoning_end)
    gate.add("thinking", [7, START])
    gate.add("thought", [START, 7, END])  # the prompt closed the reasoning
    assert gate.grammar_start("thought", [7, 8]) == 0
    assert gate.grammar_start("thinking", [7, 8]) is None
    assert gate.grammar_start("thinking", [7, END, 8]) == 2
    assert gate.grammar_start("thinking", [END]) == 1
    assert gate.advance("thinking", [7]) is None
    assert gate.advance("thinking", [8, END]) == 2
    assert gate.grammar_start("thinking", [7, END]) == 0  # ended for good


@pytest.fixture
def manager(smollm2_backend):
    manager = StructuredOutputManager(lambda: smollm2_backend, is_reasoning_end=is_reasoning_end)
    yield manager
    manager.shutdown()


@pytest.fixture
def ids(smollm2_tokenizer):
    def single(text: str) -> int:
        (token_id,) = smollm2_tokenizer.encode(text, add_special_tokens=False)
        return token_id

    return {text: single(text) for text in ("hello", "4", "2")}


def submit(manager: StructuredOutputManager, prompt: list[int]) -> None:
    manager.submit("r", ANSWER, prompt)
    deadline = time.monotonic() + 30
    while not manager.is_ready("r"):
        assert time.monotonic() < deadline, "the grammar did not compile"
        manager.wait(0.05)
    assert manager.error("r") is None


def grammar_row(backend, accepted: list[int]) -> torch.Tensor:
    """The row [1, W] of a fresh grammar after `accepted`: what the manager must send."""
    grammar = backend.compile(ANSWER)
    assert grammar.accept_tokens(accepted)
    row = backend.allocate_bitmask(1)
    grammar.fill_bitmask(row, 0)
    return row


def rows_of(manager, drafts=None) -> torch.Tensor | None:
    bitmask = manager.build_bitmask(["r"], {"r": drafts} if drafts else None)
    return None if bitmask is None else grammar_bitmask_tensor(bitmask)


def test_reasoning_is_free_and_the_grammar_starts_after_the_end(manager, ids, smollm2_backend):
    submit(manager, [7, START])
    assert rows_of(manager) is None  # no row: nothing is masked
    assert manager.accept_tokens("r", [ids["hello"], ids["hello"]])  # not "42", but reasoning
    assert manager.accept_tokens("r", [END])
    assert torch.equal(rows_of(manager), grammar_row(smollm2_backend, []))
    assert not manager.accept_tokens("r", [ids["hello"]])


def test_a_prompt_that_ended_the_reasoning_constrains_from_the_first_token(
    manager, ids, smollm2_backend
):
    submit(manager, [START, 7, END])
    assert torch.equal(rows_of(manager), grammar_row(smollm2_backend, []))
    assert not manager.accept_tokens("r", [ids["hello"]])


def test_drafts_across_the_end_are_free_before_it_and_checked_after(manager, ids, smollm2_backend):
    submit(manager, [START])
    hello, four = ids["hello"], ids["4"]
    assert manager.validate_tokens("r", [hello, END, four, hello]) == [hello, END, four]
    rows = rows_of(manager, [hello, END, four])
    assert rows.shape[0] == 4
    assert bool((rows[:2] == -1).all())  # the drafts' positions up to the end: any token
    assert torch.equal(rows[2:3], grammar_row(smollm2_backend, []))
    assert torch.equal(rows[3:4], grammar_row(smollm2_backend, [four]))
    assert rows_of(manager) is None  # masking the drafts moved nothing: still reasoning
    assert manager.accept_tokens("r", [hello, END, four])  # the target accepted them all
    assert torch.equal(rows_of(manager), grammar_row(smollm2_backend, [four]))
