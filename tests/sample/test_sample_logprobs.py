"""gather_logprobs and compute_prompt_logprobs against hand-computed values."""

import math

import pytest
import torch

from core.sample.logprobs import compute_prompt_logprobs, gather_logprobs


def test_gather_puts_the_chosen_token_first_then_the_top_k():
    logprobs = torch.tensor([[0.1, 0.6, 0.3], [0.5, 0.2, 0.3]]).log()
    out = gather_logprobs(logprobs, torch.tensor([2, 1]), num_logprobs=2)
    assert out.logprob_token_ids.tolist() == [[2, 1, 2], [1, 0, 2]]
    expected = torch.tensor([[0.3, 0.6, 0.3], [0.2, 0.5, 0.3]]).log()
    torch.testing.assert_close(out.logprobs, expected)
    assert out.selected_token_ranks.tolist() == [2, 3]


def test_tied_tokens_share_the_better_rank():
    logprobs = torch.tensor([[0.4, 0.4, 0.2]]).log()
    out = gather_logprobs(logprobs, torch.tensor([1]), num_logprobs=0)
    assert out.selected_token_ranks.tolist() == [1]
    assert out.logprob_token_ids.shape == (1, 1)


def test_num_logprobs_beyond_the_vocabulary_is_rejected():
    with pytest.raises(ValueError, match=r"^num_logprobs must be in \[0, 3\], got 4$"):
        gather_logprobs(torch.zeros(1, 3), torch.tensor([0]), num_logprobs=4)


def test_prompt_logprobs_score_each_next_prompt_token_from_raw_logits():
    # Prompt [a, b, c] gives two positions: logits after "a" predict b, after "a b" predict c.
    logits = torch.tensor([[0.0, math.log(3.0), 0.0], [math.log(2.0), 0.0, math.log(2.0)]])
    out = compute_prompt_logprobs(logits.to(torch.bfloat16), torch.tensor([1, 2]), 1)
    # row 0: probs [0.2, 0.6, 0.2]; row 1: probs [0.4, 0.2, 0.4], token 2 ties token 0
    expected = torch.tensor([[0.6, 0.6], [0.4, 0.4]]).log()
    torch.testing.assert_close(out.logprobs, expected, atol=1e-2, rtol=0)
    assert out.logprobs.dtype == torch.float32
    assert out.logprob_token_ids.tolist() == [[1, 1], [2, 0]]
    assert out.selected_token_ranks.tolist() == [1, 1]


def test_prompt_logprobs_need_one_target_per_position():
    with pytest.raises(ValueError, match=r"^target_ids must have one id per logits row \(2\)"):
        compute_prompt_logprobs(torch.zeros(2, 4), torch.tensor([1]), 1)
