"""Each logits processor alone, against Hugging Face's logits processors or numbers by hand.

Our functions take one parameter per row; the reference applies the single-valued
transformers processor row by row, so per-row handling is checked too.
"""

import pytest
import torch

from core.sample.penalties import (
    apply_presence_frequency_penalties,
    apply_repetition_penalty,
    count_tokens,
    pad_token_ids,
)
from core.sample.processors import (
    apply_allowed_token_ids,
    apply_bad_words,
    apply_logit_bias,
    apply_min_p,
    apply_min_tokens,
    apply_temperature,
)
from core.sample.top_k_top_p import apply_top_k_top_p

logits_process = pytest.importorskip("transformers.generation.logits_process")

INF = float("inf")


@pytest.fixture
def logits() -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(4, 32) * 2


def _per_row(processor_for, logits: torch.Tensor, values, input_ids=None) -> torch.Tensor:
    """Apply transformers' processor built with values[i] to row i."""
    rows = []
    for row, value in enumerate(values):
        ids = input_ids[row : row + 1] if input_ids is not None else torch.zeros(1, 0).long()
        rows.append(processor_for(value)(ids, logits[row : row + 1].clone()))
    return torch.cat(rows)


def test_top_k_matches_transformers(logits):
    top_k = [1, 5, 32, 17]
    expected = _per_row(logits_process.TopKLogitsWarper, logits, top_k)
    actual = apply_top_k_top_p(logits, torch.tensor(top_k), None)
    torch.testing.assert_close(actual, expected)


def test_top_p_matches_transformers(logits):
    top_p = [0.05, 0.5, 0.9, 1.0]
    expected = _per_row(logits_process.TopPLogitsWarper, logits, top_p)
    actual = apply_top_k_top_p(logits, None, torch.tensor(top_p))
    torch.testing.assert_close(actual, expected)


def test_top_p_renormalizes_over_the_top_k_survivors():
    # probs [0.4, 0.3, 0.2, 0.1]; top_k=2 leaves [4/7, 3/7]; top_p=0.5 then keeps token 0
    # alone (4/7 >= 0.5) although 0.4 < 0.5 on the full vocabulary.
    logits = torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log()
    kept = apply_top_k_top_p(logits, torch.tensor([2]), torch.tensor([0.5]))
    assert torch.isfinite(kept).tolist() == [[True, False, False, False]]


def test_top_k_keeps_the_lowest_id_among_ties_like_argmax():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0]])
    kept = apply_top_k_top_p(logits, torch.tensor([1]), None)
    assert torch.isfinite(kept).tolist() == [[False, True, False, False]]


def test_top_k_top_p_without_either_returns_logits_unchanged(logits):
    assert apply_top_k_top_p(logits, None, None) is logits


def test_min_p_matches_transformers(logits):
    min_p = [0.0, 0.05, 0.3, 1.0]
    expected = _per_row(logits_process.MinPLogitsWarper, logits, min_p)
    actual = apply_min_p(logits, torch.tensor(min_p))
    torch.testing.assert_close(actual, expected)


def test_temperature_matches_transformers_and_skips_greedy_rows(logits):
    temperature = [0.5, 1.0, 2.0]
    expected = _per_row(logits_process.TemperatureLogitsWarper, logits[:3], temperature)
    torch.testing.assert_close(apply_temperature(logits[:3], torch.tensor(temperature)), expected)
    greedy = apply_temperature(logits[:1], torch.tensor([0.0]))
    torch.testing.assert_close(greedy, logits[:1])


def test_repetition_penalty_matches_transformers(logits):
    penalties = [1.0, 1.3, 0.7, 2.0]
    seen_ids = torch.tensor([[0, 1, 2], [3, 3, 4], [5, 6, 7], [8, 9, 10]])
    expected = _per_row(
        logits_process.RepetitionPenaltyLogitsProcessor, logits, penalties, input_ids=seen_ids
    )
    seen_mask = count_tokens(seen_ids, vocab_size=32) > 0
    actual = apply_repetition_penalty(logits, seen_mask, torch.tensor(penalties))
    torch.testing.assert_close(actual, expected)


def test_presence_and_frequency_penalties_match_the_openai_formula():
    logits = torch.tensor([[1.0, 1.0, 1.0, 1.0]])
    counts = count_tokens(pad_token_ids([[1, 2, 2, 2]], vocab_size=4), vocab_size=4)
    actual = apply_presence_frequency_penalties(
        logits, counts, torch.tensor([0.5]), torch.tensor([0.25])
    )
    # token 1: 1 - 0.25 * 1 - 0.5 = 0.25; token 2: 1 - 0.25 * 3 - 0.5 = -0.25
    torch.testing.assert_close(actual, torch.tensor([[1.0, 0.25, -0.25, 1.0]]))


def test_count_tokens_ignores_padding():
    padded = pad_token_ids([[2, 2, 0], []], vocab_size=3)
    assert padded.tolist() == [[2, 2, 0], [3, 3, 3]]
    assert count_tokens(padded, vocab_size=3).tolist() == [[1, 0, 2], [0, 0, 0]]


def test_pad_token_ids_of_empty_lists_has_zero_width():
    assert pad_token_ids([[], []], vocab_size=5).shape == (2, 0)


def test_bad_words_match_transformers_on_generated_tokens():
    logits = torch.zeros(3, 6)
    bad_words = [[5], [1, 2], [3, 4, 0]]
    outputs = [[0, 1], [3, 4], [2]]
    expected = torch.cat(
        [
            logits_process.NoBadWordsLogitsProcessor(bad_words)(
                torch.tensor([output]), logits[row : row + 1].clone()
            )
            for row, output in enumerate(outputs)
        ]
    )
    actual = apply_bad_words(logits, dict.fromkeys(range(3), bad_words), outputs)
    torch.testing.assert_close(actual, expected)
    assert actual[0].tolist() == [0, 0, -INF, 0, 0, -INF]  # [1] ends the output: ban 2


def test_bad_words_skip_rows_without_entries():
    logits = torch.zeros(2, 3)
    actual = apply_bad_words(logits, {1: [[2]]}, [[], []])
    assert actual.tolist() == [[0, 0, 0], [0, 0, -INF]]


def test_min_tokens_matches_transformers_min_new_tokens():
    logits = torch.zeros(2, 5)
    outputs = [[1, 1], [1, 1, 1]]
    expected = torch.cat(
        [
            logits_process.MinNewTokensLengthLogitsProcessor(
                prompt_length_to_skip=0, min_new_tokens=3, eos_token_id=[0, 4]
            )(torch.tensor([output]), logits[row : row + 1].clone())
            for row, output in enumerate(outputs)
        ]
    )
    actual = apply_min_tokens(logits, {0: (3, {0, 4}), 1: (3, {0, 4})}, outputs)
    torch.testing.assert_close(actual, expected)
    assert actual[0].tolist() == [-INF, 0, 0, 0, -INF]


def test_logit_bias_adds_per_row_values():
    logits = torch.zeros(2, 3)
    actual = apply_logit_bias(logits, {0: {1: 2.5}, 1: {0: -1.0, 2: 100.0}})
    assert actual.tolist() == [[0.0, 2.5, 0.0], [-1.0, 0.0, 100.0]]


def test_allowed_token_ids_mask_bans_the_rest():
    logits = torch.ones(2, 3)
    mask = torch.tensor([[True, False, True], [True, True, True]])
    assert apply_allowed_token_ids(logits, mask).tolist() == [[1, -INF, 1], [1, 1, 1]]


def test_processors_never_modify_their_input(logits):
    before = logits.clone()
    apply_bad_words(logits, {0: [[3]]}, [[], [], [], []])
    apply_logit_bias(logits, {1: {2: 5.0}})
    apply_min_tokens(logits, {2: (4, {0})}, [[], [], [], []])
    apply_min_p(logits, torch.full((4,), 0.5))
    apply_temperature(logits, torch.full((4,), 0.5))
    apply_top_k_top_p(logits, torch.full((4,), 3), torch.full((4,), 0.5))
    apply_repetition_penalty(logits, logits > 0, torch.full((4,), 1.5))
    assert torch.equal(logits, before)
