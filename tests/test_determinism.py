"""The determinism policy helper itself: it passes what DESIGN.md section 5 allows and
fails everything else."""

from __future__ import annotations

import pytest
import torch
from determinism import assert_greedy_equivalent

EOS = 9


def logits_with_gap(gap: float):
    """Next-token logits [4] whose top two (tokens 1 and 2) differ by `gap`; scale 10."""
    return lambda tokens: torch.tensor([-10.0, 5.0, 5.0 - gap, 0.0])


def test_identical_runs_pass():
    assert_greedy_equivalent([1, 2, 3], [1, 2, 3], logits_with_gap(5.0), context=[0])


def test_a_divergence_passes_only_at_a_near_tie():
    assert_greedy_equivalent([1, 2, 3], [1, 4, 5], logits_with_gap(1e-4), context=[0])
    with pytest.raises(AssertionError, match="diverge at token 1"):
        assert_greedy_equivalent([1, 2, 3], [1, 4, 5], logits_with_gap(0.5), context=[0])


@pytest.mark.parametrize(("ours", "reference"), [([1, 2], [1, 2, 3]), ([1, 2, 3], [1, 2])])
def test_a_run_that_ends_early_without_a_stop_token_fails(ours, reference):
    with pytest.raises(AssertionError, match="agree on 2 tokens"):
        assert_greedy_equivalent(ours, reference, logits_with_gap(5.0), context=[0])


def test_a_run_may_end_at_a_stop_token_the_other_ran_past():
    ours, reference = [1, EOS, 3, 3], [1, EOS]
    assert_greedy_equivalent(ours, reference, logits_with_gap(5.0), [0], stop_token_ids={EOS})
