"""DefaultSampler end to end: each processor's effect, their order, determinism, logprobs."""

import math

import pytest
import torch

from core.sample import DefaultSampler, SamplingMetadata
from core.sampling_params import SamplingParams


def _sample(
    logits: torch.Tensor,
    params: list[SamplingParams],
    *,
    output_token_ids: list[list[int]] | None = None,
    prompt_token_ids: list[list[int]] | None = None,
    generators: dict[int, torch.Generator] | None = None,
    eos_token_id: int | None = None,
):
    num_rows, vocab_size = logits.shape
    metadata = SamplingMetadata.from_params(
        params,
        output_token_ids=output_token_ids or [[] for _ in range(num_rows)],
        prompt_token_ids=prompt_token_ids or [[] for _ in range(num_rows)],
        vocab_size=vocab_size,
        generators=generators,
        eos_token_id=eos_token_id,
    )
    return DefaultSampler()(logits, metadata)


def _tokens(logits, params, **kwargs) -> list[int]:
    return _sample(logits, params, **kwargs).sampled_token_ids.tolist()


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


GREEDY = SamplingParams(temperature=0.0)


def test_penalties_apply_before_temperature():
    # Right order: (2 - 1.5) / 0.5 = 1.0 < 1 / 0.5 = 2.0, token 1 wins.
    # Temperature first would give 2 / 0.5 - 1.5 = 2.5 > 2.0, token 0.
    logits = torch.tensor([[2.0, 1.0, -5.0]])
    params = [SamplingParams(temperature=0.5, top_k=1, presence_penalty=1.5)]
    assert _tokens(logits, params, output_token_ids=[[0]]) == [1]


def test_logit_bias_applies_before_repetition_penalty():
    # Right order: (1 + 1) / 2 = 1.0 < 1.2, token 1; penalty first: 1 / 2 + 1 = 1.5, token 0.
    logits = torch.tensor([[1.0, 1.2]])
    params = [SamplingParams(temperature=0.0, logit_bias={0: 1.0}, repetition_penalty=2.0)]
    assert _tokens(logits, params, prompt_token_ids=[[0]]) == [1]


def test_min_p_applies_after_temperature():
    # At T=1, min_p=0.5 keeps p >= 0.25: tokens 0 and 1. At T=0.5 the distribution is
    # p^2 renormalized = [0.66, 0.24, 0.11], so only token 0 clears 0.5 * 0.66.
    logits = torch.tensor([[0.5, 0.3, 0.2]]).log().expand(300, 3)
    torch.manual_seed(0)
    tokens = _tokens(logits, [SamplingParams(temperature=0.5, min_p=0.5)] * 300)
    assert set(tokens) == {0}
    tokens = _tokens(logits, [SamplingParams(temperature=1.0, min_p=0.5)] * 300)
    assert set(tokens) == {0, 1}


def test_top_p_applies_after_temperature():
    # At T=1 top_p=0.6 keeps tokens 0 and 1 (mass before token 1 is 0.5 < 0.6);
    # at T=0.5 token 0 alone holds 0.66 >= 0.6.
    logits = torch.tensor([[0.5, 0.3, 0.2]]).log().expand(300, 3)
    torch.manual_seed(0)
    assert set(_tokens(logits, [SamplingParams(temperature=0.5, top_p=0.6)] * 300)) == {0}
    assert set(_tokens(logits, [SamplingParams(temperature=1.0, top_p=0.6)] * 300)) == {0, 1}


def test_greedy_rows_take_the_argmax_beside_random_rows():
    torch.manual_seed(0)
    logits = torch.randn(6, 50)
    params = [GREEDY, SamplingParams(), GREEDY, SamplingParams(seed=1), GREEDY, GREEDY]
    tokens = _tokens(logits, params, generators={3: _generator(1)})
    argmax = logits.argmax(dim=-1).tolist()
    assert [tokens[i] for i in (0, 2, 4, 5)] == [argmax[i] for i in (0, 2, 4, 5)]


def test_top_k_one_equals_greedy():
    torch.manual_seed(0)
    logits = torch.randn(8, 50)
    assert _tokens(logits, [SamplingParams(temperature=1.5, top_k=1)] * 8) == _tokens(
        logits, [GREEDY] * 8
    )


def test_small_top_p_equals_greedy():
    torch.manual_seed(1)
    logits = torch.randn(8, 50)
    assert _tokens(logits, [SamplingParams(temperature=1.0, top_p=0.01)] * 8) == _tokens(
        logits, [GREEDY] * 8
    )


def test_min_p_never_samples_filtered_tokens():
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log().expand(400, 4)
    torch.manual_seed(0)
    tokens = _tokens(logits, [SamplingParams(min_p=0.5)] * 400)
    assert set(tokens) == {0, 1}


def test_logit_bias_forces_the_least_likely_token():
    logits = torch.tensor([[3.0, 1.0, -2.0]]).expand(4, 3)
    bias = {2: 100.0}
    params = [
        SamplingParams(temperature=0.0, logit_bias=bias),
        SamplingParams(logit_bias=bias),
        SamplingParams(seed=5, logit_bias=bias),
        SamplingParams(top_k=2, logit_bias=bias),
    ]
    assert _tokens(logits, params, generators={2: _generator(5)}) == [2, 2, 2, 2]


def test_allowed_token_ids_restrict_greedy_and_random_rows():
    torch.manual_seed(0)
    logits = torch.randn(1, 20).expand(200, 20)
    allowed = [3, 7, 11]
    best_allowed = max(allowed, key=lambda i: logits[0, i].item())
    assert _tokens(logits[:1], [SamplingParams(temperature=0.0, allowed_token_ids=allowed)]) == [
        best_allowed
    ]
    tokens = _tokens(logits, [SamplingParams(temperature=2.0, allowed_token_ids=allowed)] * 200)
    assert set(tokens) == set(allowed)


def test_single_token_bad_word_is_never_chosen():
    logits = torch.tensor([[1.0, 5.0, 2.0]])
    params = [SamplingParams(temperature=0.0, bad_words_token_ids=[[1]])]
    assert _tokens(logits, params) == [2]


def test_multi_token_bad_word_bans_its_last_token_only_after_its_prefix():
    logits = torch.tensor([[1.0, 5.0, 2.0, 0.0]]).expand(2, 4)
    params = [SamplingParams(temperature=0.0, bad_words_token_ids=[[3, 0, 1]])] * 2
    outputs = [[2, 3, 0], [3, 2, 0]]  # row 0 ends with the prefix [3, 0], row 1 does not
    assert _tokens(logits, params, output_token_ids=outputs) == [2, 1]


def test_min_tokens_suppresses_eos_and_stop_token_ids_until_reached():
    eos, stop = 0, 1
    logits = torch.tensor([[9.0, 8.0, 1.0, 0.0]]).expand(3, 4)
    params = [SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=[stop])] * 3
    outputs = [[3], [3, 3], [3, 3, 3]]
    assert _tokens(logits, params, output_token_ids=outputs, eos_token_id=eos) == [2, 0, 0]


def test_min_tokens_leaves_eos_alone_when_ignore_eos():
    logits = torch.tensor([[9.0, 1.0]])
    params = [SamplingParams(temperature=0.0, min_tokens=3, ignore_eos=True)]
    assert _tokens(logits, params, output_token_ids=[[1]], eos_token_id=0) == [0]


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits():
    # 3.0 / 2 = 1.5 < 2.0, and -1.0 * 2 = -2.0 < -1.5: the penalized token loses both times.
    logits = torch.tensor([[3.0, 2.0], [-1.0, -1.5]])
    params = [SamplingParams(temperature=0.0, repetition_penalty=2.0)] * 2
    assert _tokens(logits, params, prompt_token_ids=[[0], []], output_token_ids=[[], [0]]) == [
        1,
        1,
    ]


def test_frequency_penalty_counts_occurrences_in_the_output():
    # Token 0 was generated 3 times: 2.0 - 0.5 * 3 = 0.5 < 1.0; with one occurrence 1.5 > 1.0.
    logits = torch.tensor([[2.0, 1.0]]).expand(2, 2)
    params = [SamplingParams(temperature=0.0, frequency_penalty=0.5)] * 2
    assert _tokens(logits, params, output_token_ids=[[0, 0, 0], [0]]) == [1, 0]


def test_presence_penalty_ignores_prompt_tokens():
    logits = torch.tensor([[2.0, 1.0]])
    params = [SamplingParams(temperature=0.0, presence_penalty=2.0)]
    assert _tokens(logits, params, prompt_token_ids=[[0]]) == [0]
    assert _tokens(logits, params, output_token_ids=[[0]]) == [1]


def _seeded_run(logits_rows: torch.Tensor, params, seeded_row: int, seed: int, steps: int):
    """Sample ``steps`` times, carrying the seeded row's generator from step to step."""
    generators = {seeded_row: _generator(seed)}
    return [_tokens(logits_rows, params, generators=generators)[seeded_row] for _ in range(steps)]


def test_seed_reproduces_tokens_whatever_the_batch_mates():
    torch.manual_seed(0)
    row_logits = torch.randn(1, 64) * 0.3
    seeded = SamplingParams(temperature=1.0, seed=7)
    alone = _seeded_run(row_logits, [seeded], seeded_row=0, seed=7, steps=20)

    mates = torch.randn(4, 64)
    mates[2] = row_logits[0]
    params = [SamplingParams(), GREEDY, seeded, SamplingParams(temperature=0.3, top_k=5)]
    among_mates = _seeded_run(mates, params, seeded_row=2, seed=7, steps=20)
    assert among_mates == alone

    other_seed = _seeded_run(row_logits, [SamplingParams(seed=8)], seeded_row=0, seed=8, steps=20)
    assert other_seed != alone


def test_seeded_row_ignores_the_default_generator_state():
    logits = torch.zeros(1, 64)
    params = [SamplingParams(seed=3)]
    torch.manual_seed(0)
    first = _seeded_run(logits, params, seeded_row=0, seed=3, steps=10)
    torch.manual_seed(1)
    assert _seeded_run(logits, params, seeded_row=0, seed=3, steps=10) == first


@pytest.mark.parametrize(("temperature", "expected"), [(1.0, 0.75), (2.0, 0.634)])
def test_unseeded_sampling_follows_the_tempered_distribution(temperature, expected):
    # p = [0.25, 0.75]; at T=2 it becomes sqrt(p) renormalized = [0.366, 0.634].
    # 2000 draws: std of the frequency ~0.011, so +-0.05 only fails when sampling is wrong.
    torch.manual_seed(0)
    logits = torch.tensor([[0.25, 0.75]]).log().expand(2000, 2)
    tokens = torch.tensor(_tokens(logits, [SamplingParams(temperature=temperature)] * 2000))
    assert abs(tokens.float().mean().item() - expected) < 0.05


def test_logprobs_come_from_raw_logits_with_ranks_of_sampled_tokens():
    torch.manual_seed(0)
    logits = torch.randn(3, 30).to(torch.bfloat16)
    params = [
        SamplingParams(temperature=0.7, logprobs=4, presence_penalty=1.0, seed=1),
        SamplingParams(temperature=0.0, logprobs=1, repetition_penalty=1.5),
        SamplingParams(temperature=1.3, top_k=10),
    ]
    out = _sample(
        logits,
        params,
        output_token_ids=[[1, 2], [3], []],
        prompt_token_ids=[[4], [5], [6]],
        generators={0: _generator(1)},
    )
    reference = torch.log_softmax(logits.float(), dim=-1)
    sampled = out.sampled_token_ids
    assert out.logprobs is not None
    assert out.logprobs.logprob_token_ids[:, 0].tolist() == sampled.tolist()
    torch.testing.assert_close(
        out.logprobs.logprobs[:, 0], reference.gather(1, sampled[:, None])[:, 0]
    )
    top_values, top_ids = reference.topk(4, dim=-1)
    assert out.logprobs.logprob_token_ids[:, 1:].tolist() == top_ids.tolist()
    torch.testing.assert_close(out.logprobs.logprobs[:, 1:], top_values)
    order = reference.argsort(dim=-1, descending=True).tolist()
    expected_ranks = [order[row].index(token) + 1 for row, token in enumerate(sampled.tolist())]
    assert out.logprobs.selected_token_ranks.tolist() == expected_ranks


def test_no_logprobs_requested_gives_none():
    assert _sample(torch.randn(2, 10), [SamplingParams()] * 2).logprobs is None


def test_zero_logprobs_returns_only_the_sampled_token():
    logits = torch.tensor([[0.0, math.log(3.0)]])
    out = _sample(logits, [SamplingParams(temperature=0.0, logprobs=0)])
    assert out.logprobs.logprob_token_ids.tolist() == [[1]]
    torch.testing.assert_close(out.logprobs.logprobs, torch.tensor([[math.log(0.75)]]))
    assert out.logprobs.selected_token_ranks.tolist() == [1]


def test_sampler_leaves_its_input_logits_unchanged():
    torch.manual_seed(0)
    logits = torch.randn(2, 16)
    before = logits.clone()
    params = [
        SamplingParams(temperature=0.5, top_p=0.5, min_p=0.1, logit_bias={1: 3.0}),
        SamplingParams(temperature=0.0, repetition_penalty=1.3, allowed_token_ids=[1, 2]),
    ]
    _sample(logits, params, output_token_ids=[[1], [2]], prompt_token_ids=[[3], [4]])
    assert torch.equal(logits, before)


def test_sampled_token_ids_are_int64_of_batch_size():
    out = _sample(torch.randn(5, 12), [SamplingParams()] * 5)
    assert out.sampled_token_ids.dtype == torch.int64
    assert out.sampled_token_ids.shape == (5,)
