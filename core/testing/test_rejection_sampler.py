"""Conformance of a rejection sampler (`--core-conformance=rejection_sampler:mod.path:Cls`).

The RejectionSampler contract (core.spec_decode.interface): greedy rows accept drafts
while they are the argmax, then emit the argmax (on hand-made logits whose expected
tokens are worked out here); random rows emit tokens distributed exactly as sampling the
target token by token would (Pearson's chi-square test of the first token, of the second
given that the first draft was accepted, and of the bonus token, against drafts chosen to
be often wrong, so that a sampler skipping the residual max(0, p - q) fails); seeded
requests are reproducible and independent of their batch; inputs are left unchanged.
Random draws are compared as distributions, never token by token: two correct samplers
may consume their random numbers differently.

The helpers (`verify`, `emitted_p_values`, `chi_square_p_value`) are public so that a
project's own tests can run the same checks on a sampler that is not installed.
"""

from __future__ import annotations

import pytest
import torch

from core.sample.metadata import SamplingMetadata
from core.sampling_params import SAMPLING_EPS
from core.spec_decode.interface import PLACEHOLDER_TOKEN_ID as PAD
from core.spec_decode.interface import RejectionSampler
from core.testing.plugin import targets_of

SIGNIFICANCE = 1e-3
"""A correct sampler fails a chi-square check with this probability (on a fixed seed:
never, for a given implementation)."""
NUM_REQUESTS = 20_000
"""Requests per distribution check: enough that skipping the residual fails by far."""

# Target distributions at a request's three rows (draft 1, draft 2, bonus) and the draft
# distributions the random drafts are drawn from: far enough apart that about half the
# drafts are rejected. P2 bans token 7, which Q2 drafts a fifth of the time.
P1 = [0.30, 0.05, 0.20, 0.10, 0.15, 0.05, 0.10, 0.05]
P2 = [0.05, 0.25, 0.10, 0.20, 0.05, 0.30, 0.05, 0.00]
P3 = [0.10, 0.10, 0.30, 0.05, 0.05, 0.10, 0.10, 0.20]
Q1 = [0.05, 0.30, 0.05, 0.20, 0.05, 0.20, 0.05, 0.10]
Q2 = [0.20, 0.05, 0.20, 0.05, 0.20, 0.05, 0.05, 0.20]
CONSTANT_DRAFTS = [0, 1]  # a deterministic drafter that always proposes the same tokens
# "constant" leaves q implicit (None), "constant_one_hot" passes the same q as a tensor:
# the two paths of a sampler that treats deterministic drafts specially.
DRAFTERS = ["none", "constant", "constant_one_hot", "random"]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    targets = targets_of(metafunc.config, "rejection_sampler")
    params = [pytest.param(t.value, id=t.id) for t in targets]
    metafunc.parametrize("rejection_sampler_cls", params)


@pytest.fixture
def rejection_sampler(rejection_sampler_cls: type[RejectionSampler]) -> RejectionSampler:
    return rejection_sampler_cls()


# -- running a sampler --------------------------------------------------------------------


def batch_metadata(
    num_draft_tokens: list[int],
    temperatures: list[float],
    seeds: list[int | None],
    device: torch.device,
) -> SamplingMetadata:
    """One row per logits row: each request's temperature on its n_r + 1 rows, and one
    generator per seeded random request, mapped from all its rows."""
    rows_per_request = torch.tensor(num_draft_tokens) + 1  # [R]
    temperature = torch.tensor(temperatures, dtype=torch.float32)  # [R]
    generators: dict[int, torch.Generator] = {}
    first_row = 0
    for n, temp, seed in zip(num_draft_tokens, temperatures, seeds, strict=True):
        if seed is not None and temp >= SAMPLING_EPS:
            generator = torch.Generator(device).manual_seed(seed)
            generators.update(dict.fromkeys(range(first_row, first_row + n + 1), generator))
        first_row += n + 1
    greedy = [t < SAMPLING_EPS for t in temperatures]
    return SamplingMetadata(
        temperature=temperature.repeat_interleave(rows_per_request).to(device),
        all_greedy=all(greedy),
        all_random=not any(greedy),
        top_p=None,
        top_k=None,
        min_p=None,
        generators=generators,
        max_num_logprobs=None,
        output_token_ids=[[] for _ in range(first_row)],
    )


def verify(
    sampler: RejectionSampler,
    device: torch.device,
    logits: torch.Tensor,
    num_draft_tokens: list[int],
    draft_token_ids: list[int] | torch.Tensor,
    draft_probs: torch.Tensor | None = None,
    *,
    temperatures: list[float] | None = None,
    seeds: list[int | None] | None = None,
) -> torch.Tensor:
    """One sampler call on `device` -> its [R, max(n_r) + 1] output on the CPU.

    Requests are random (temperature 1) and unseeded unless `temperatures` / `seeds`
    (one per request) say otherwise.
    """
    num_reqs = len(num_draft_tokens)
    metadata = batch_metadata(
        num_draft_tokens,
        temperatures if temperatures is not None else [1.0] * num_reqs,
        seeds if seeds is not None else [None] * num_reqs,
        device,
    )
    draft_token_ids = torch.as_tensor(draft_token_ids, dtype=torch.int64)
    if draft_probs is not None:
        draft_probs = draft_probs.to(device)
    output = sampler(
        logits.to(device), metadata, num_draft_tokens, draft_token_ids.to(device), draft_probs
    )
    return output.cpu()


def peaked_logits(argmaxes: list[int | list[int]], vocab_size: int = 6) -> torch.Tensor:
    """[len(argmaxes), V] logits whose row i peaks at argmaxes[i] (a list: a tie)."""
    generator = torch.Generator().manual_seed(0)
    logits = -torch.rand(len(argmaxes), vocab_size, generator=generator)  # [N, V] in (-1, 0]
    for row, peak in enumerate(argmaxes):
        logits[row, peak] = 1.0
    return logits


# -- greedy: exact, worked out by hand -----------------------------------------------------

# Request by request: drafts, the argmax of each of its rows, and what it must emit.
GREEDY_REQUESTS = [
    ([2, 4, 1], [2, 4, 5, 0], [2, 4, 5, PAD]),  # two accepted, the third corrected
    ([], [3], [3, PAD, PAD, PAD]),  # no drafts: the argmax alone
    ([1, 1], [1, 1, 4], [1, 1, 4, PAD]),  # all accepted, then the bonus argmax
    ([0, 2, 2], [5, 2, 2, 1], [5, PAD, PAD, PAD]),  # the first rejected: later matches void
    ([3], [[1, 3], 0], [1, PAD, PAD, PAD]),  # a tie: argmax is the lower id, not the draft
]


def greedy_batch() -> tuple[torch.Tensor, list[int], list[int], list[list[int]]]:
    """(logits, num_draft_tokens, draft_token_ids, expected rows) of GREEDY_REQUESTS."""
    argmaxes = [peak for _, peaks, _ in GREEDY_REQUESTS for peak in peaks]
    num_draft_tokens = [len(drafts) for drafts, _, _ in GREEDY_REQUESTS]
    draft_token_ids = [token for drafts, _, _ in GREEDY_REQUESTS for token in drafts]
    expected = [emitted for _, _, emitted in GREEDY_REQUESTS]
    return peaked_logits(argmaxes), num_draft_tokens, draft_token_ids, expected


def test_greedy_accepts_drafts_while_they_are_the_argmax(
    rejection_sampler, core_conformance_device
) -> None:
    logits, num_draft_tokens, draft_token_ids, expected = greedy_batch()
    temperatures = [0.0] * len(num_draft_tokens)
    got = verify(
        rejection_sampler,
        core_conformance_device,
        logits,
        num_draft_tokens,
        draft_token_ids,
        temperatures=temperatures,
    )
    assert got.tolist() == expected


def test_greedy_requests_beside_random_requests_stay_exact(
    rejection_sampler, core_conformance_device
) -> None:
    logits, num_draft_tokens, draft_token_ids, expected = greedy_batch()
    # Append a random request with drafts after the greedy ones, and give it draft_probs.
    random_logits = torch.zeros(4, logits.shape[-1])  # uniform target
    draft_probs = torch.full((sum(num_draft_tokens) + 3, logits.shape[-1]), 1 / 6)
    got = verify(
        rejection_sampler,
        core_conformance_device,
        torch.cat([logits, random_logits]),
        [*num_draft_tokens, 3],
        [*draft_token_ids, 0, 1, 2],
        draft_probs,
        temperatures=[0.0] * len(num_draft_tokens) + [1.0],
        seeds=[None] * len(num_draft_tokens) + [3],
    )
    assert got[:-1].tolist() == expected


def test_requests_without_drafts_emit_one_token(rejection_sampler, core_conformance_device):
    logits = peaked_logits([4, 1, 0])
    got = verify(
        rejection_sampler, core_conformance_device, logits, [0, 0, 0], [], temperatures=[0.0] * 3
    )
    assert got.tolist() == [[4], [1], [0]]


@pytest.mark.parametrize("with_draft_probs", [False, True], ids=["one-hot-q", "draft-probs"])
def test_random_request_whose_target_allows_one_token_emits_it(
    rejection_sampler, core_conformance_device, with_draft_probs: bool
) -> None:
    # Request 0 allows 3, then 0, then 2: draft 3 has p = 1 (always accepted), draft 1
    # has p = 0 (always rejected), so the residual is p itself: token 0. Request 1
    # allows 5, then 4, then 1: both drafts accepted whatever q, then the bonus 1.
    allowed = [3, 0, 2, 5, 4, 1]
    logits = torch.full((len(allowed), 6), float("-inf"))
    logits[torch.arange(len(allowed)), torch.tensor(allowed)] = 0.0
    draft_probs = None
    if with_draft_probs:
        noise = torch.randn(4, 6, generator=torch.Generator().manual_seed(1))
        draft_probs = noise.softmax(dim=-1)  # [D, V], positive everywhere
    got = verify(
        rejection_sampler,
        core_conformance_device,
        logits,
        [2, 2],
        [3, 1, 5, 4],
        draft_probs,
        seeds=[0, 1],
    )
    assert got.tolist() == [[3, 0, PAD], [5, 4, 1]]


# -- random: the target's distribution, whatever the drafts --------------------------------


def chi_square_p_value(tokens: torch.Tensor, probs: list[float]) -> float:
    """The p-value of Pearson's chi-square test that `tokens` [M] were drawn from `probs`.

    0.0 when a token of probability 0 (or outside the vocabulary) was drawn. Every possible
    token must expect at least 5 draws, which the test's approximation needs.
    """
    target = torch.tensor(probs, dtype=torch.float64)  # [V]
    if len(tokens) and (tokens.min() < 0 or tokens.max() >= len(probs)):
        return 0.0
    counts = torch.bincount(tokens, minlength=len(probs)).to(torch.float64)  # [V]
    possible = target > 0
    if counts[~possible].any():
        return 0.0
    expected = target[possible] / target.sum() * len(tokens)
    if (expected < 5).any():
        raise ValueError(f"{len(tokens)} draws are too few for a chi-square test of {probs}")
    statistic = ((counts[possible] - expected) ** 2 / expected).sum()
    dof = torch.tensor(float(possible.sum() - 1), dtype=torch.float64)
    # The chi-square survival function is the regularized upper incomplete gamma function.
    return float(torch.special.gammaincc(dof / 2, statistic / 2))


def drafted_batch(
    drafter: str, num_reqs: int
) -> tuple[torch.Tensor, list[int], torch.Tensor, torch.Tensor | None]:
    """(logits, num_draft_tokens, draft_token_ids, draft_probs) of `num_reqs` identical
    requests: "none" without drafts (target P1), else two drafts at targets P1, P2 and
    the bonus row P3, "constant" drafting CONSTANT_DRAFTS (q one-hot, implicit or given),
    "random" drafting from Q1, Q2."""
    if drafter == "none":
        logits = torch.tensor([P1]).log().expand(num_reqs, -1)  # [R, V]
        return logits, [0] * num_reqs, torch.empty(0, dtype=torch.int64), None
    logits = torch.tensor([P1, P2, P3]).log().repeat(num_reqs, 1)  # [3R, V]
    if drafter in ("constant", "constant_one_hot"):
        drafts = torch.tensor(CONSTANT_DRAFTS).repeat(num_reqs)  # [2R]
        one_hot = torch.nn.functional.one_hot(drafts, len(P1)).float()  # [2R, V]
        return logits, [2] * num_reqs, drafts, one_hot if drafter == "constant_one_hot" else None
    draft_probs = torch.tensor([Q1, Q2]).repeat(num_reqs, 1)  # [2R, V]
    generator = torch.Generator().manual_seed(0)
    draft_token_ids = torch.multinomial(draft_probs, 1, generator=generator).squeeze(-1)
    return logits, [2] * num_reqs, draft_token_ids, draft_probs


def emitted_p_values(
    sampler: RejectionSampler, device: torch.device, drafter: str, num_reqs: int = NUM_REQUESTS
) -> dict[str, float]:
    """Chi-square p-values of the emitted tokens of `drafted_batch(drafter, num_reqs)`
    (every request seeded) against the target: "first" against P1, and with drafts
    "second" (given the first draft was accepted) against P2, "bonus" (given both
    were) against P3."""
    logits, num_draft_tokens, draft_token_ids, draft_probs = drafted_batch(drafter, num_reqs)
    seeds: list[int | None] = list(range(num_reqs))
    emitted = verify(
        sampler, device, logits, num_draft_tokens, draft_token_ids, draft_probs, seeds=seeds
    )
    p_values = {"first": chi_square_p_value(emitted[:, 0], P1)}
    if drafter != "none":
        first_accepted = emitted[:, 1] != PAD
        all_accepted = emitted[:, 2] != PAD
        p_values["second"] = chi_square_p_value(emitted[first_accepted, 1], P2)
        p_values["bonus"] = chi_square_p_value(emitted[all_accepted, 2], P3)
    return p_values


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_emitted_tokens_follow_the_target(
    rejection_sampler, core_conformance_device, drafter: str
) -> None:
    p_values = emitted_p_values(rejection_sampler, core_conformance_device, drafter)
    failed = {position: p for position, p in p_values.items() if p < SIGNIFICANCE}
    assert not failed, f"emitted tokens do not follow the target (chi-square p-values {failed})"


# -- the shape of the output, seeds, inputs ------------------------------------------------

VOCAB = 16
MIXED_DRAFT_COUNTS = [3, 0, 4, 1, 2, 4]


def random_batch(
    num_draft_tokens: list[int], seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logits, draft_token_ids, draft_probs) with drafts drawn from draft_probs and a
    flat enough target that about half of them are rejected."""
    generator = torch.Generator().manual_seed(seed)
    num_drafts = sum(num_draft_tokens)
    logits = torch.randn(num_drafts + len(num_draft_tokens), VOCAB, generator=generator)
    draft_probs = torch.randn(num_drafts, VOCAB, generator=generator).softmax(dim=-1)
    draft_token_ids = torch.multinomial(draft_probs, 1, generator=generator).squeeze(-1)
    return logits, draft_token_ids, draft_probs


def test_output_is_accepted_drafts_then_one_token(rejection_sampler, core_conformance_device):
    num_draft_tokens = MIXED_DRAFT_COUNTS * 8
    logits, draft_token_ids, draft_probs = random_batch(num_draft_tokens, seed=1)
    emitted = verify(
        rejection_sampler,
        core_conformance_device,
        logits,
        num_draft_tokens,
        draft_token_ids,
        draft_probs,
    )
    assert emitted.shape == (len(num_draft_tokens), max(num_draft_tokens) + 1)
    assert emitted.dtype == torch.int64
    drafts = draft_token_ids.split(num_draft_tokens)
    for row, n, request_drafts in zip(emitted.tolist(), num_draft_tokens, drafts, strict=True):
        length = len(row) - row.count(PAD)
        assert 1 <= length <= n + 1 and row[length:] == [PAD] * (len(row) - length)
        assert row[: length - 1] == request_drafts[: length - 1].tolist()
        assert 0 <= row[length - 1] < VOCAB


def test_same_seeds_give_the_same_tokens(rejection_sampler, core_conformance_device) -> None:
    logits, draft_token_ids, draft_probs = random_batch(MIXED_DRAFT_COUNTS, seed=2)
    seeds: list[int | None] = [100 + r for r in range(len(MIXED_DRAFT_COUNTS))]
    args = (logits, MIXED_DRAFT_COUNTS, draft_token_ids, draft_probs)
    first = verify(rejection_sampler, core_conformance_device, *args, seeds=seeds)
    again = verify(rejection_sampler, core_conformance_device, *args, seeds=seeds)
    assert torch.equal(again, first)


def test_different_seeds_give_different_tokens(rejection_sampler, core_conformance_device):
    num_reqs = 32
    logits, draft_token_ids, draft_probs = random_batch([3], seed=3)
    emitted = verify(
        rejection_sampler,
        core_conformance_device,
        logits.repeat(num_reqs, 1),
        [3] * num_reqs,
        draft_token_ids.repeat(num_reqs),
        draft_probs.repeat(num_reqs, 1),
        seeds=list(range(num_reqs)),
    )
    assert len({tuple(row) for row in emitted.tolist()}) > 1


def test_seeded_request_ignores_its_batch(rejection_sampler, core_conformance_device) -> None:
    # Request 2 of MIXED_DRAFT_COUNTS, seeded, alone and then among seeded or unseeded
    # batch mates: the same tokens each time.
    logits, draft_token_ids, draft_probs = random_batch(MIXED_DRAFT_COUNTS, seed=4)
    rows = logits.split([n + 1 for n in MIXED_DRAFT_COUNTS])
    drafts = draft_token_ids.split(MIXED_DRAFT_COUNTS)
    probs = draft_probs.split(MIXED_DRAFT_COUNTS)
    alone = verify(
        rejection_sampler,
        core_conformance_device,
        rows[2],
        [MIXED_DRAFT_COUNTS[2]],
        drafts[2],
        probs[2],
        seeds=[7],
    )[0]
    args = (logits, MIXED_DRAFT_COUNTS, draft_token_ids, draft_probs)
    num_reqs = len(MIXED_DRAFT_COUNTS)
    for mates in (list(range(num_reqs)), [None] * num_reqs):
        seeds: list[int | None] = [*mates[:2], 7, *mates[3:]]
        in_batch = verify(rejection_sampler, core_conformance_device, *args, seeds=seeds)[2]
        assert torch.equal(in_batch[: len(alone)], alone)


def test_inputs_are_left_unchanged(rejection_sampler, core_conformance_device) -> None:
    logits, draft_token_ids, draft_probs = random_batch(MIXED_DRAFT_COUNTS, seed=5)
    temperatures = [0.0, 1.0, 0.5, 0.0, 1.0, 1.0]  # greedy and random requests mixed
    metadata = batch_metadata(
        MIXED_DRAFT_COUNTS, temperatures, [None, 1, 2, None, None, 3], core_conformance_device
    )
    inputs = [t.to(core_conformance_device) for t in (logits, draft_token_ids, draft_probs)]
    before = [t.clone() for t in (*inputs, metadata.temperature)]
    rejection_sampler(inputs[0], metadata, list(MIXED_DRAFT_COUNTS), inputs[1], inputs[2])
    for tensor, original in zip((*inputs, metadata.temperature), before, strict=True):
        assert torch.equal(tensor, original)
