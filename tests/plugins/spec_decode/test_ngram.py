"""The n-gram (prompt lookup) proposer: vLLM's semantics, hand-worked and against a
token-by-token reference; its options; its resolution through `--speculative-config`."""

from __future__ import annotations

import numpy as np
import pytest
from core_spec_decode.ngram import NgramOptions, NgramProposer

from core.config import SpeculativeConfig
from core.sampling_params import SamplingParams
from core.spec_decode.interface import ProposalBatch, ProposerContext
from core.spec_decode.selector import check_speculative_config


def ngram(k: int, low: int, high: int) -> NgramProposer:
    config = SpeculativeConfig.from_json(
        {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": low,
         "prompt_lookup_max": high}
    )  # fmt: skip
    # The n-gram proposer reads nothing of the target: an empty context.
    return NgramProposer(config, ProposerContext(None, None, None, None, None, None))


def no_forward(rows: np.ndarray, positions: np.ndarray):
    raise AssertionError("the n-gram proposer runs no forward")


def batch_of(rows: list[list[int]], k: int, propose_rows: list[int] | None = None) -> ProposalBatch:
    """Rows padded past their end with their last token, so any read past num_tokens
    would lengthen a match or a draft."""
    width = max(map(len, rows)) + 8
    token_ids = np.zeros((len(rows), width), dtype=np.int64)
    for r, row in enumerate(rows):
        token_ids[r, : len(row)] = row
        token_ids[r, len(row) :] = row[-1] if row else 0
    num_tokens = np.array([len(row) for row in rows], dtype=np.int64)
    return ProposalBatch(
        req_ids=[f"req-{r}" for r in range(len(rows))],
        token_ids=token_ids,
        num_tokens=num_tokens,
        num_computed_tokens=num_tokens - 1,
        num_committed_tokens=num_tokens,
        propose_rows=np.arange(len(rows)) if propose_rows is None else np.array(propose_rows),
        sampling_params=[SamplingParams() for _ in rows],
        num_speculative_tokens=k,
        forward_context=no_forward,
    )


def propose_one(row: list[int], k: int, low: int, high: int) -> list[int]:
    return ngram(k, low, high).propose(batch_of([row], k))[0]


# (tokens, k, prompt_lookup_min, prompt_lookup_max) -> drafts, each worked by hand.
HAND_CASES = {
    # vLLM's docstring example: [4, 2, 3] does not recur, [2, 3] does at 1; 3 tokens follow.
    "vllm-example": (([1, 2, 3, 4, 2, 3], 4, 2, 3), [4, 2, 3]),
    # [1, 5] recurs at 3 (-> 9 1 5); the shorter [5] would have matched at 0 (-> 8 3 1).
    "longest-match-first": (([5, 8, 3, 1, 5, 9, 1, 5], 3, 1, 2), [9, 1, 5]),
    # [1, 2] at 0 and at 3: the earliest one's continuation, as vLLM.
    "earliest-occurrence": (([1, 2, 10, 1, 2, 20, 1, 2], 1, 2, 2), [10]),
    # Only [6] recurs, and 1-grams are below the minimum.
    "below-min-no-match": (([4, 6, 0, 9, 6], 3, 2, 3), []),
    "min-1-matches-the-1-gram": (([4, 6, 0, 9, 6], 3, 1, 3), [0, 9, 6]),
    # [1, 2, 3] recurs at 4 (-> 9 1 2); with max 2, [2, 3] first recurs at 1 (-> 8 1 2).
    "max-3-sees-the-3-gram": (([5, 2, 3, 8, 1, 2, 3, 9, 1, 2, 3], 3, 1, 3), [9, 1, 2]),
    "max-2-caps-the-match": (([5, 2, 3, 8, 1, 2, 3, 9, 1, 2, 3], 3, 1, 2), [8, 1, 2]),
    "k-truncates": (([1, 2, 3, 4, 5, 6, 1, 2], 3, 2, 2), [3, 4, 5]),
    "k-1": (([1, 2, 3, 4, 5, 6, 1, 2], 1, 2, 2), [3]),
    # An occurrence may overlap the suffix; drafts stop at the row's end.
    "overlap-stops-at-row-end": (([1, 1, 1, 1], 4, 2, 3), [1]),
    "stops-at-row-end": (([3, 4, 3, 4], 5, 2, 2), [3, 4]),
    "no-recurrence": (([1, 2, 3, 4, 5], 3, 1, 3), []),
    "one-token": (([7], 3, 1, 3), []),
    "shorter-than-min": (([7, 7], 3, 2, 3), []),
}


@pytest.mark.parametrize("case", HAND_CASES)
def test_hand_worked_drafts(case: str) -> None:
    (tokens, k, low, high), want = HAND_CASES[case]
    assert propose_one(tokens, k, low, high) == want


def test_tokens_past_num_tokens_are_never_read() -> None:
    batch = batch_of([[4, 5, 4]], 3)
    batch.token_ids[0, 3:] = [5, 4, 5, 4, 5, 4, 5, 4]  # would extend the draft to 5 4 5
    assert ngram(3, 1, 1).propose(batch) == [[5, 4]]


def test_rows_of_different_lengths_in_one_batch_get_their_own_drafts() -> None:
    # All with min 1, max 3, k 3; each worked by hand.
    rows = {
        (1, 2, 3, 4, 2, 3): [4, 2, 3],  # [4, 2, 3] no; [2, 3] at 1
        (5, 8, 3, 1, 5, 9, 1, 5): [9, 1, 5],  # [9, 1, 5] no; [1, 5] at 3
        (7,): [],
        (1, 1, 1, 1): [1],  # [1, 1, 1] at 0
        (6, 0, 2, 6, 0, 6, 0): [2, 6, 0],  # [0, 6, 0] no; [6, 0] at 0 and 3
        (1, 2, 3, 4, 5): [],
    }
    drafts = ngram(3, 1, 3).propose(batch_of([list(row) for row in rows], 3))
    assert drafts == list(rows.values())


def test_only_proposed_rows_get_drafts_in_their_order() -> None:
    rows = [[1, 2, 1], [3, 4, 3], [5, 6, 5], [7, 8, 7]]
    drafts = ngram(2, 1, 1).propose(batch_of(rows, 2, propose_rows=[1, 3]))
    assert drafts == [[4, 3], [8, 7]]


def test_no_rows_to_propose_for() -> None:
    assert ngram(2, 1, 3).propose(batch_of([[1, 1, 1]], 2, propose_rows=[])) == []


def test_drafts_are_python_ints() -> None:
    drafts = propose_one([1, 2, 1], 2, 1, 1)
    assert drafts == [2, 1] and all(type(token) is int for token in drafts)


def reference_drafts(tokens: list[int], k: int, low: int, high: int) -> list[int]:
    """vLLM's rule token by token: the longest suffix n-gram in [low, high] that occurs
    earlier (starting before the suffix), its earliest occurrence, up to k tokens after."""
    size = len(tokens)
    for n in range(min(high, size - 1), low - 1, -1):
        suffix = tokens[size - n :]
        for start in range(size - n):
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + k]
    return []


@pytest.mark.parametrize(("k", "low", "high"), [(1, 1, 1), (3, 1, 3), (4, 2, 5), (5, 3, 3)])
@pytest.mark.parametrize("seed", [0, 1])
def test_agrees_with_the_token_by_token_reference(seed: int, k: int, low: int, high: int) -> None:
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(24):
        alphabet = int(rng.integers(2, 6))  # small alphabets, so long matches happen
        rows.append(rng.integers(0, alphabet, int(rng.integers(1, 80))).tolist())
    propose_rows = sorted(rng.choice(len(rows), 18, replace=False).tolist())
    want = [reference_drafts(rows[r], k, low, high) for r in propose_rows]
    assert ngram(k, low, high).propose(batch_of(rows, k, propose_rows)) == want
    assert any(len(drafts) == k for drafts in want)  # the cases exercise full drafts


def test_batch_is_left_unchanged() -> None:
    batch = batch_of([[1, 2, 1, 2], [3, 3]], 2)
    before = batch.token_ids.copy(), batch.num_tokens.copy(), batch.num_committed_tokens.copy()
    ngram(2, 1, 2).propose(batch)
    np.testing.assert_array_equal(batch.token_ids, before[0])
    np.testing.assert_array_equal(batch.num_tokens, before[1])
    np.testing.assert_array_equal(batch.num_committed_tokens, before[2])


def test_needs_no_model_and_no_kv_cache() -> None:
    proposer = ngram(2, 1, 2)
    assert NgramProposer.writes_kv_cache is False
    assert proposer.attention_layers() == []


# -- options ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "bounds"),
    [
        ({}, (5, 5)),  # vLLM's defaults
        ({"prompt_lookup_max": 3}, (3, 3)),  # one bound alone sets both, as in vLLM
        ({"prompt_lookup_min": 2}, (2, 2)),
        ({"prompt_lookup_min": 2, "prompt_lookup_max": 4}, (2, 4)),
    ],
)
def test_option_defaults_follow_vllm(given: dict, bounds: tuple[int, int]) -> None:
    options = NgramOptions.model_validate(given)
    assert (options.prompt_lookup_min, options.prompt_lookup_max) == bounds


def spec(**options: object) -> SpeculativeConfig:
    return SpeculativeConfig.from_json({"method": "ngram", "num_speculative_tokens": 3, **options})


def test_speculative_config_resolves_ngram() -> None:
    assert check_speculative_config(spec(prompt_lookup_min=2, prompt_lookup_max=4)) is NgramProposer


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"prompt_lookup_min": 0, "prompt_lookup_max": 3}, "prompt_lookup_min"),
        ({"prompt_lookup_min": 1, "prompt_lookup_max": 0}, "prompt_lookup_max"),
        ({"prompt_lookup_min": 4, "prompt_lookup_max": 2}, "prompt_lookup_max"),
        ({"prompt_lookup_min": "2"}, "prompt_lookup_min"),
        ({"prompt_lookup_min": True}, "prompt_lookup_min"),
        ({"prompt_lookup_min": 2.0}, "prompt_lookup_min"),
        ({"prompt_lookup_maximum": 3}, "prompt_lookup_maximum"),
    ],
)
def test_bad_options_are_refused_naming_the_field(options: dict, field: str) -> None:
    with pytest.raises(ValueError, match=rf"speculative_config\.{field}\b"):
        check_speculative_config(spec(**options))


def test_min_above_max_says_both() -> None:
    with pytest.raises(ValueError, match=r"must be >= prompt_lookup_min \(4\), got 2"):
        check_speculative_config(spec(prompt_lookup_min=4, prompt_lookup_max=2))


def test_the_proposer_refuses_bad_options_itself() -> None:
    config = SpeculativeConfig(method="ngram", num_speculative_tokens=2, options={"n": 3})
    with pytest.raises(ValueError, match=r"speculative_config\.n\b"):
        NgramProposer(config, ProposerContext(None, None, None, None, None, None))
