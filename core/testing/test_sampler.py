"""Conformance of a sampler (`--core-conformance=sampler:NAME`).

The Sampler contract (core.sample.interface): greedy rows take the argmax of the
processed logits and equal the reference sampler's tokens, for every processor; the
processors run in DESIGN.md's order (checked on hand-made logits whose expected token
is worked out here, not taken from any sampler); seeded rows are reproducible and
independent of their batch; random rows follow the distribution that temperature,
top-k and top-p leave; logprobs describe the raw logits; inputs are left unchanged;
`process_logits`, where implemented (speculative decoding needs it), agrees with the
reference: the same argmax on greedy rows, the same distribution on random rows.
Random draws are compared as distributions, never token by token: two correct samplers
may consume their random numbers differently.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

import pytest
import torch

from core.sample.interface import Sampler, SamplerOutput
from core.sample.metadata import SamplingMetadata
from core.sample.sampler import DefaultSampler
from core.sampling_params import SamplingParams
from core.testing.plugin import targets_of

NUM_ROWS, VOCAB = 8, 64
GREEDY = SamplingParams(temperature=0.0)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    params = [pytest.param(t.value, id=t.id) for t in targets_of(metafunc.config, "sampler")]
    metafunc.parametrize("sampler_cls", params)


@pytest.fixture
def sampler(sampler_cls: type[Sampler]) -> Sampler:
    return sampler_cls()


@pytest.fixture
def run(sampler: Sampler, core_conformance_device: torch.device) -> Callable[..., SamplerOutput]:
    """Sample `logits` [B, V] with one SamplingParams per row on the device under test."""

    def run(logits: torch.Tensor, params: list[SamplingParams], **kwargs) -> SamplerOutput:
        return sample(sampler, logits, params, core_conformance_device, **kwargs)

    return run


def sample(
    sampler: Sampler,
    logits: torch.Tensor,
    params: list[SamplingParams],
    device: torch.device,
    *,
    output_token_ids: list[list[int]] | None = None,
    prompt_token_ids: list[list[int]] | None = None,
    eos_token_id: int | None = None,
) -> SamplerOutput:
    """One sampler call; seeded rows get a fresh generator seeded with their seed."""
    metadata = batch_metadata(
        params,
        logits.shape[-1],
        device,
        output_token_ids=output_token_ids,
        prompt_token_ids=prompt_token_ids,
        eos_token_id=eos_token_id,
    )
    return sampler(logits.to(device), metadata)


def batch_metadata(
    params: list[SamplingParams],
    vocab_size: int,
    device: torch.device,
    *,
    output_token_ids: list[list[int]] | None = None,
    prompt_token_ids: list[list[int]] | None = None,
    eos_token_id: int | None = None,
) -> SamplingMetadata:
    """The metadata of one row per params; seeded rows get a fresh generator."""
    generators = {
        row: torch.Generator(device).manual_seed(p.seed)
        for row, p in enumerate(params)
        if p.seed is not None and p.temperature > 0
    }
    return SamplingMetadata.from_params(
        params,
        output_token_ids=output_token_ids or [[] for _ in params],
        prompt_token_ids=prompt_token_ids or [[] for _ in params],
        vocab_size=vocab_size,
        generators=generators,
        eos_token_id=eos_token_id,
        device=device,
    )


def tokens(output: SamplerOutput) -> list[int]:
    return output.sampled_token_ids.cpu().tolist()


def random_logits(seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(NUM_ROWS, VOCAB, generator=generator) * 3).to(dtype)  # [B, V]


# -- greedy: the argmax, and the reference's token under every processor ------------------

GREEDY_CASES: dict[str, dict] = {
    "plain": {},
    "bfloat16-logits": {"dtype": torch.bfloat16},
    "logit-bias": {"params": {"logit_bias": {3: 9.0, 5: -9.0}}},
    "min-tokens": {"params": {"min_tokens": 4}, "eos_token_id": 7},
    "allowed-token-ids": {"params": {"allowed_token_ids": [2, 3, 5, 11, 40]}},
    "bad-words": {"params": {"bad_words_token_ids": [[9], [1, 2]]}},
    "repetition-penalty": {"params": {"repetition_penalty": 1.8}},
    "presence-frequency-penalties": {"params": {"presence_penalty": 1.5, "frequency_penalty": 0.7}},
}


@pytest.mark.parametrize("case", GREEDY_CASES)
def test_greedy_rows_match_the_reference(run, case: str) -> None:
    spec = GREEDY_CASES[case]
    logits = random_logits(1, spec.get("dtype", torch.float32))
    params = [SamplingParams(temperature=0.0, **spec.get("params", {}))] * NUM_ROWS
    history = torch.Generator().manual_seed(2)
    kwargs = dict(
        # Histories that contain each row's argmax, so penalties and bad words bite.
        output_token_ids=[[int(logits[r].argmax()), 1] for r in range(NUM_ROWS)],
        prompt_token_ids=torch.randint(VOCAB, (NUM_ROWS, 6), generator=history).tolist(),
        eos_token_id=spec.get("eos_token_id"),
    )
    want = tokens(sample(DefaultSampler(), logits, params, torch.device("cpu"), **kwargs))
    assert tokens(run(logits, params, **kwargs)) == want


def test_greedy_is_the_argmax(run) -> None:
    logits = random_logits(3)
    assert tokens(run(logits, [GREEDY] * NUM_ROWS)) == logits.argmax(-1).tolist()


def test_greedy_rows_beside_random_rows_stay_the_argmax(run) -> None:
    logits = random_logits(4)
    params = [GREEDY if r % 2 else SamplingParams(temperature=1.0, seed=r) for r in range(NUM_ROWS)]
    got = tokens(run(logits, params))
    assert got[1::2] == logits.argmax(-1)[1::2].tolist()


# -- processor order, on logits where the wrong order picks another token ----------------


def test_penalties_apply_before_temperature(run) -> None:
    # (2 - 1.5) / 0.5 = 1.0 < 1 / 0.5 = 2.0: token 1. Temperature first: 2 / 0.5 - 1.5 = 2.5.
    logits = torch.tensor([[2.0, 1.0, -5.0]])
    params = [SamplingParams(temperature=0.5, top_k=1, presence_penalty=1.5, seed=0)]
    assert tokens(run(logits, params, output_token_ids=[[0]])) == [1]


def test_logit_bias_applies_before_repetition_penalty(run) -> None:
    # (1 + 1) / 2 = 1.0 < 1.2: token 1. Penalty first: 1 / 2 + 1 = 1.5 > 1.2, token 0.
    logits = torch.tensor([[1.0, 1.2]])
    params = [SamplingParams(temperature=0.0, logit_bias={0: 1.0}, repetition_penalty=2.0)]
    assert tokens(run(logits, params, prompt_token_ids=[[0]])) == [1]


def test_min_tokens_masks_eos_until_reached(run) -> None:
    logits = torch.tensor([[5.0, 1.0, 3.0, 2.0]])  # eos (0) is the argmax
    params = [SamplingParams(temperature=0.0, min_tokens=2)]
    assert tokens(run(logits, params, output_token_ids=[[1]], eos_token_id=0)) == [2]
    assert tokens(run(logits, params, output_token_ids=[[1, 3]], eos_token_id=0)) == [0]


def test_min_p_applies_after_temperature(run) -> None:
    # At T=1, min_p=0.5 keeps p >= 0.25: tokens 0 and 1. At T=0.5 the distribution is
    # [0.66, 0.24, 0.11], so only token 0 clears 0.5 * 0.66.
    assert _drawn(run, [0.5, 0.3, 0.2], temperature=0.5, min_p=0.5) == {0}
    assert _drawn(run, [0.5, 0.3, 0.2], temperature=1.0, min_p=0.5) == {0, 1}


def test_top_p_applies_after_temperature(run) -> None:
    # At T=1 top_p=0.6 keeps tokens 0 and 1 (mass before token 1 is 0.5 < 0.6); at T=0.5
    # token 0 alone holds 0.66 >= 0.6.
    assert _drawn(run, [0.5, 0.3, 0.2], temperature=0.5, top_p=0.6) == {0}
    assert _drawn(run, [0.5, 0.3, 0.2], temperature=1.0, top_p=0.6) == {0, 1}


def _drawn(run, probs: list[float], num_draws: int = 300, **params) -> set[int]:
    """Tokens drawn over `num_draws` seeded rows of the distribution `probs`."""
    logits = torch.tensor([probs]).log().expand(num_draws, len(probs))
    rows = [SamplingParams(seed=row, **params) for row in range(num_draws)]
    return set(tokens(run(logits, rows)))


# -- randomness: seeds, batch independence, the distribution ------------------------------


def test_same_seeds_give_the_same_tokens(run) -> None:
    logits = random_logits(5) / 3  # flat enough that draws vary
    params = [SamplingParams(temperature=1.0, seed=100 + r) for r in range(NUM_ROWS)]
    assert tokens(run(logits, params)) == tokens(run(logits, params))


def test_different_seeds_give_different_tokens(run) -> None:
    logits = random_logits(5)[:1].expand(NUM_ROWS * 4, VOCAB) / 3
    params = [SamplingParams(temperature=1.0, seed=r) for r in range(NUM_ROWS * 4)]
    assert len(set(tokens(run(logits, params)))) > 1


def test_seeded_row_ignores_its_batch(run) -> None:
    logits = random_logits(6) / 3
    row = SamplingParams(temperature=1.0, seed=7)
    alone = tokens(run(logits[3:4], [row]))
    others = [SamplingParams(temperature=1.0, seed=r) for r in range(NUM_ROWS)]
    others[3] = row
    assert tokens(run(logits, others))[3] == alone[0]
    unseeded = [SamplingParams(temperature=0.7) for _ in range(NUM_ROWS)]
    unseeded[3] = row
    assert tokens(run(logits, unseeded))[3] == alone[0]


def test_random_rows_follow_temperature_top_k_top_p(run) -> None:
    probs = [0.35, 0.25, 0.2, 0.1, 0.06, 0.04]
    num_draws = 4000
    expected = _truncated(probs, temperature=0.8, top_k=4, top_p=0.8)
    logits = torch.tensor([probs]).log().expand(num_draws, len(probs))
    params = [SamplingParams(temperature=0.8, top_k=4, top_p=0.8, seed=s) for s in range(num_draws)]
    counts = Counter(tokens(run(logits, params)))
    for token, p in enumerate(expected):
        freq = counts[token] / num_draws
        bound = 5 * math.sqrt(p * (1 - p) / num_draws)  # zero for a removed token
        assert abs(freq - p) <= bound, f"token {token}: drawn {freq:.3f}, expected {p:.3f}"


def _truncated(probs: list[float], temperature: float, top_k: int, top_p: float) -> list[float]:
    """The distribution sampled: tempered, top-k, then the smallest prefix reaching top_p
    (renormalized over top-k's tokens). `probs` must be sorted, most likely first."""
    tempered = [p ** (1 / temperature) for p in probs]
    kept = [w / sum(tempered[:top_k]) for w in tempered[:top_k]]
    mass, nucleus = 0.0, []
    for p in kept:
        if mass >= top_p:
            break
        nucleus.append(p)
        mass += p
    return [p / sum(nucleus) for p in nucleus] + [0.0] * (len(probs) - len(nucleus))


# -- logprobs and inputs ------------------------------------------------------------------


def test_logprobs_come_from_the_raw_logits(run) -> None:
    logits = random_logits(8)
    params = [SamplingParams(temperature=0.0, logprobs=3, logit_bias={0: 5.0})] * NUM_ROWS
    got = run(logits, params).logprobs
    want = sample(DefaultSampler(), logits, params, torch.device("cpu")).logprobs
    assert got is not None and want is not None
    assert torch.equal(got.logprob_token_ids.cpu(), want.logprob_token_ids)
    assert torch.equal(got.selected_token_ranks.cpu(), want.selected_token_ranks)
    torch.testing.assert_close(got.logprobs.cpu(), want.logprobs, atol=1e-5, rtol=1e-5)


def test_inputs_are_left_unchanged(sampler: Sampler, core_conformance_device) -> None:
    logits = random_logits(9).to(core_conformance_device)
    before = logits.clone()
    history = [[1, 2] for _ in range(NUM_ROWS)]
    params = [SamplingParams(temperature=0.9, seed=r, presence_penalty=0.5) for r in range(8)]
    sample(sampler, logits, params, core_conformance_device, output_token_ids=history)
    assert torch.equal(logits, before)
    assert history == [[1, 2]] * NUM_ROWS


# -- process_logits: what speculative decoding verifies drafts against --------------------


def test_processed_logits_match_the_reference(sampler: Sampler, core_conformance_device) -> None:
    """Greedy rows: the same argmax; random rows: the same distribution (softmax)."""
    logits = random_logits(10)
    params = [
        SamplingParams(
            temperature=0.0 if row % 2 else 0.8,
            top_k=0 if row % 4 else 12,
            top_p=0.9,
            min_p=0.05,
            presence_penalty=0.5,
            logit_bias={3: 2.0},
            seed=row,
        )
        for row in range(NUM_ROWS)
    ]
    history = [[int(logits[r].argmax()), 1] for r in range(NUM_ROWS)]
    metadata = batch_metadata(params, VOCAB, core_conformance_device, output_token_ids=history)
    try:
        got = sampler.process_logits(logits.to(core_conformance_device), metadata).cpu()
    except NotImplementedError:
        pytest.skip(f"{type(sampler).__name__} does not implement process_logits")
    reference = batch_metadata(params, VOCAB, torch.device("cpu"), output_token_ids=history)
    want = DefaultSampler().process_logits(logits, reference)
    assert got.dtype == torch.float32
    assert torch.equal(got[1::2].argmax(-1), want[1::2].argmax(-1))
    torch.testing.assert_close(got[::2].softmax(-1), want[::2].softmax(-1), atol=1e-5, rtol=1e-5)
