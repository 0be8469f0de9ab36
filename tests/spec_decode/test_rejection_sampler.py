"""StandardRejectionSampler: the conformance kit's checks, a broken sampler they catch,
and what the reference promises beyond the contract."""

from __future__ import annotations

import pytest
import torch

from core.sample import DefaultSampler, SamplingMetadata
from core.sampling_params import SamplingParams
from core.spec_decode.interface import PLACEHOLDER_TOKEN_ID as PAD
from core.spec_decode.rejection_sampler import StandardRejectionSampler

# The kit's checks, collected here too (pytest collects imported test functions) so the
# fast suite runs them on the reference; the `rejection_sampler` fixture below feeds them.
from core.testing.test_rejection_sampler import (  # noqa: F401
    SIGNIFICANCE,
    batch_metadata,
    chi_square_p_value,
    emitted_p_values,
    test_different_seeds_give_different_tokens,
    test_emitted_tokens_follow_the_target,
    test_greedy_accepts_drafts_while_they_are_the_argmax,
    test_greedy_requests_beside_random_requests_stay_exact,
    test_inputs_are_left_unchanged,
    test_output_is_accepted_drafts_then_one_token,
    test_random_request_whose_target_allows_one_token_emits_it,
    test_requests_without_drafts_emit_one_token,
    test_same_seeds_give_the_same_tokens,
    test_seeded_request_ignores_its_batch,
    verify,
)

CPU = torch.device("cpu")


@pytest.fixture
def rejection_sampler() -> StandardRejectionSampler:
    return StandardRejectionSampler()


class BrokenRejectionSampler(StandardRejectionSampler):
    """Replaces a rejected draft with a draw from p instead of max(0, p - q): drafts
    rejected once can come back, so tokens the drafter favours are emitted too often."""

    def _recovery_weights(self, target_probs, draft_token_ids, draft_probs):
        return target_probs


# -- the chi-square check itself -----------------------------------------------------------


def test_chi_square_p_value_matches_the_closed_form_of_two_degrees_of_freedom():
    # Expected [50, 25, 25], observed [60, 20, 20]: statistic 2 + 1 + 1 = 4, and with
    # two degrees of freedom the survival function is exp(-x / 2).
    tokens = torch.tensor([0] * 60 + [1] * 20 + [2] * 20)
    assert chi_square_p_value(tokens, [0.5, 0.25, 0.25]) == pytest.approx(torch.e**-2, rel=1e-9)


def test_chi_square_p_value_is_zero_when_an_impossible_token_is_drawn():
    tokens = torch.tensor([0] * 50 + [1] * 49 + [2])
    assert chi_square_p_value(tokens, [0.5, 0.5, 0.0]) == 0.0


@pytest.mark.parametrize("drafter", ["constant_one_hot", "random"])
def test_skipping_the_residual_fails_the_distribution_check(drafter: str):
    p_values = emitted_p_values(BrokenRejectionSampler(), CPU, drafter)
    assert p_values["first"] < SIGNIFICANCE
    assert p_values["second"] < SIGNIFICANCE
    # The bonus token is drawn from p whatever happens to rejected drafts.
    assert p_values["bonus"] >= SIGNIFICANCE


# -- beyond the contract -------------------------------------------------------------------


def test_drafts_drawn_from_the_target_itself_are_all_accepted():
    # q == p: accepting with probability min(1, p / q) = 1, every time.
    num_reqs, vocab_size = 64, 8
    logits = torch.randn(num_reqs * 4, vocab_size, generator=torch.Generator().manual_seed(0))
    draft_rows = torch.arange(num_reqs * 4).reshape(num_reqs, 4)[:, :3].flatten()  # [3R]
    draft_probs = logits[draft_rows].softmax(dim=-1)
    draft_token_ids = torch.multinomial(draft_probs, 1).squeeze(-1)
    emitted = verify(
        StandardRejectionSampler(), CPU, logits, [3] * num_reqs, draft_token_ids, draft_probs
    )
    assert torch.equal(emitted[:, :3], draft_token_ids.reshape(num_reqs, 3))
    assert (emitted[:, 3] != PAD).all()


def test_rejection_with_an_empty_residual_still_draws_a_target_token():
    # p is uniform over {2, 3}; q puts mass 1 on draft 2 and matches p elsewhere, so
    # max(0, p - q) is all zero (rounding does this to a near-equal p and q) while the
    # draft is rejected half the time. The replacement must still come from p.
    num_reqs = 200
    logits = torch.tensor([[float("-inf"), float("-inf"), 0.0, 0.0]] * 2).repeat(num_reqs, 1)
    draft_probs = torch.tensor([[0.0, 0.0, 1.0, 0.5]]).repeat(num_reqs, 1)
    emitted = verify(
        StandardRejectionSampler(),
        CPU,
        logits,
        [1] * num_reqs,
        [2] * num_reqs,
        draft_probs,
        seeds=list(range(num_reqs)),
    )
    rejected = emitted[:, 1] == PAD
    assert 0 < rejected.sum() < num_reqs
    assert set(emitted[rejected, 0].tolist()) <= {2, 3}


def test_with_draft_probs_a_seeded_request_consumes_its_generator_by_a_fixed_amount():
    # Its n uniforms, then (n + 1) x V exponentials, whatever is accepted: a fresh
    # generator that draws as much ends in the same state.
    num_drafts, vocab_size, seed = 3, 8, 11
    logits = torch.randn(num_drafts + 1, vocab_size, generator=torch.Generator().manual_seed(0))
    metadata = batch_metadata([num_drafts], [1.0], [seed], CPU)
    drafts = torch.tensor([1, 2, 3])
    draft_probs = torch.nn.functional.one_hot(drafts, vocab_size).float()
    StandardRejectionSampler()(logits, metadata, [num_drafts], drafts, draft_probs)
    reference = torch.Generator().manual_seed(seed)
    torch.rand(num_drafts, generator=reference)
    torch.empty(num_drafts + 1, vocab_size).exponential_(generator=reference)
    assert torch.equal(metadata.generators[0].get_state(), reference.get_state())


@pytest.mark.parametrize(
    ("num_draft_tokens", "num_drafts", "probs_shape", "message"),
    [
        ([2, 1], 3, None, "logits must have .* = 5 rows, got 6"),
        ([2, 2], 3, None, r"draft_token_ids must have shape \(4,\), got \(3,\)"),
        ([2, 2], 4, (4, 3), r"draft_probs must have shape \(4, 8\), got \(4, 3\)"),
    ],
)
def test_inconsistent_shapes_are_refused_naming_the_argument(
    num_draft_tokens, num_drafts, probs_shape, message
):
    metadata = batch_metadata(num_draft_tokens, [1.0] * len(num_draft_tokens), [None, None], CPU)
    draft_token_ids = torch.zeros(num_drafts, dtype=torch.int64)
    draft_probs = None if probs_shape is None else torch.full(probs_shape, 0.25)
    with pytest.raises(ValueError, match=message):
        sampler = StandardRejectionSampler()
        sampler(torch.zeros(6, 8), metadata, num_draft_tokens, draft_token_ids, draft_probs)


def test_a_seeded_request_without_drafts_samples_what_the_sampler_would():
    # Both draw V exponentials from the request's generator and take argmax(p / E), so
    # speculation changes nothing for a step in which a request has no drafts.
    logits = torch.randn(4, 32, generator=torch.Generator().manual_seed(2))
    params = [SamplingParams(temperature=0.8, top_k=10, seed=row) for row in range(4)]
    sampler_metadata = SamplingMetadata.from_params(
        params,
        output_token_ids=[[] for _ in params],
        prompt_token_ids=[[] for _ in params],
        vocab_size=32,
        generators={row: torch.Generator().manual_seed(row) for row in range(4)},
    )
    processed = DefaultSampler().process_logits(logits, sampler_metadata)
    expected = DefaultSampler()(logits, sampler_metadata).sampled_token_ids
    metadata = batch_metadata([0] * 4, [0.8] * 4, list(range(4)), CPU)
    emitted = StandardRejectionSampler()(processed, metadata, [0] * 4, torch.empty(0).long())
    assert torch.equal(emitted[:, 0], expected)


def test_seeded_one_hot_drafts_give_the_tokens_sampling_without_drafts_gives():
    # Whatever a seeded request's drafts are, its tokens are those the default sampler
    # draws from the same seed, token by token: the rewound generator makes them so.
    vocab_size, num_tokens = 8, 6
    logits = torch.randn(num_tokens, vocab_size, generator=torch.Generator().manual_seed(3))
    params = SamplingParams(temperature=1.0, seed=7)
    plain_generator = torch.Generator().manual_seed(7)
    expected = []
    for i in range(num_tokens):
        metadata = SamplingMetadata.from_params(
            [params], output_token_ids=[[]], prompt_token_ids=[[1]], vocab_size=vocab_size,
            generators={0: plain_generator},
        )  # fmt: skip
        expected.append(int(DefaultSampler()(logits[i : i + 1], metadata).sampled_token_ids))
    for drafts_per_step in ([2, 1, 0], [0, 0, 0, 0, 0, 0], [5]):
        generator = torch.Generator().manual_seed(7)
        emitted, position = [], 0
        for n in drafts_per_step:
            if position >= num_tokens:
                break
            n = min(n, num_tokens - position - 1)
            guesses = [(expected[position + j] + (j % 2)) % vocab_size for j in range(n)]
            rows = logits[position : position + n + 1]
            metadata = SamplingMetadata.from_params(
                [params] * (n + 1), output_token_ids=[[]] * (n + 1),
                prompt_token_ids=[[1]] * (n + 1), vocab_size=vocab_size,
                generators=dict.fromkeys(range(n + 1), generator),
            )  # fmt: skip
            out = StandardRejectionSampler()(
                rows, metadata, [n], torch.tensor(guesses, dtype=torch.int64)
            )
            tokens = [t for t in out[0].tolist() if t != PAD]
            emitted += tokens
            position += len(tokens)
        assert emitted == expected[: len(emitted)]
        assert len(emitted) >= min(len(drafts_per_step), num_tokens)
