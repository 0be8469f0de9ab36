"""StandardRejectionSampler: the pure-PyTorch reference RejectionSampler, vectorized."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import accumulate

import torch

from core.sample.metadata import SamplingMetadata
from core.sampling_params import SAMPLING_EPS
from core.spec_decode.interface import PLACEHOLDER_TOKEN_ID, RejectionSampler
from core.spec_decode.verification import num_verified

__all__ = ["StandardRejectionSampler"]


class StandardRejectionSampler(RejectionSampler):
    """Reference implementation of the RejectionSampler contract; takes no configuration.

    Vectorized over the whole batch without a CPU sync: every draft is tested, and every
    row gets a candidate token (drawn from the residual max(0, p - q) at a draft row, from
    p at a request's last row); each request's first rejection then picks which candidate
    it emits. Wasting the draws past a rejection is what buys the absence of a sync.
    Greedy rows (temperature < SAMPLING_EPS) use the argmax instead of both draws.

    Randomness, drafts drawn from q (`draft_probs`): each draft row takes one uniform u
    (accept when u * q(d) < p(d), i.e. with probability min(1, p(d) / q(d))) and each row V
    exponentials E for its candidate, argmax(w / E) (the exponential race
    `core.sample.sampler.random_sample` uses). A seeded request draws, from its generator
    only: its n_r uniforms, then its (n_r + 1) x V exponentials.

    Deterministic drafts (`draft_probs` None, q one-hot): each row's candidate is a draw
    from p itself, argmax(p / E), and a draft is accepted when it equals that draw. That is
    the same rejection sampler (P(accept d) = p(d) = min(1, p(d) / 1), and a draw from p
    that is not d follows p without d, renormalized: the residual), with one more property:
    a seeded request consumes exactly V exponentials per token it emits (its generator is
    rewound past the unused rows, one host sync), as sampling without drafts does, so its
    tokens are the ones it would get without speculation, whatever its drafts were.
    """

    def forward(
        self,
        logits: torch.Tensor,
        metadata: SamplingMetadata,
        num_draft_tokens: list[int],
        draft_token_ids: torch.Tensor,
        draft_probs: torch.Tensor | None = None,
    ) -> torch.Tensor:
        _check_shapes(logits, num_draft_tokens, draft_token_ids, draft_probs)
        layout = _Layout.of(num_draft_tokens, logits.device)
        target_argmax = logits.argmax(dim=-1)  # [N]
        draft_is_argmax = draft_token_ids == target_argmax[layout.draft_rows]  # [D]
        if metadata.all_greedy:
            return _emit(layout, draft_token_ids, draft_is_argmax, target_argmax)
        accepted, sampled = self._verify_random(
            logits, metadata.generators, layout, draft_token_ids, draft_probs
        )
        greedy = metadata.temperature < SAMPLING_EPS  # [N]
        accepted = torch.where(greedy[layout.draft_rows], draft_is_argmax, accepted)  # [D]
        candidates = torch.where(greedy, target_argmax, sampled)  # [N]
        return _emit(layout, draft_token_ids, accepted, candidates)

    def _verify_random(
        self,
        logits: torch.Tensor,
        generators: Mapping[int, torch.Generator],
        layout: _Layout,
        draft_token_ids: torch.Tensor,
        draft_probs: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(accepted [D] bool, candidate [N] int64) of every row as a random row."""
        probs = logits.softmax(dim=-1, dtype=torch.float32)  # [N, V]
        if draft_probs is None:
            return self._verify_coupled(probs, generators, layout, draft_token_ids)
        uniform, noise = _draw(layout, generators, probs.shape[-1], probs.device)
        draft_target_probs = probs[layout.draft_rows]  # [D, V]
        p = draft_target_probs.gather(-1, draft_token_ids.unsqueeze(-1)).squeeze(-1)  # [D]
        q = torch.ones_like(p)  # one-hot q: the draft had probability 1
        if draft_probs is not None:
            q = draft_probs.gather(-1, draft_token_ids.unsqueeze(-1)).squeeze(-1).to(p.dtype)
        accepted = uniform * q < p  # [D]; p(d) = 0 (a banned draft) is always rejected
        recovery = self._recovery_weights(draft_target_probs, draft_token_ids, draft_probs)
        weights = probs.index_copy(0, layout.draft_rows, recovery)  # [N, V]
        return accepted, weights.div(noise).argmax(dim=-1)

    def _verify_coupled(
        self,
        probs: torch.Tensor,
        generators: Mapping[int, torch.Generator],
        layout: _Layout,
        draft_token_ids: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(accepted [D], candidate [N]) for one-hot drafts: every candidate a draw from p."""
        noise = torch.empty_like(probs).exponential_()  # [N, V]
        rewinds = _draw_seeded_rows(noise, layout, generators)
        noise = noise.clamp_min(torch.finfo(noise.dtype).tiny)
        candidates = probs.div(noise).argmax(dim=-1)  # [N]
        accepted = candidates[layout.draft_rows] == draft_token_ids  # [D]
        if rewinds:
            emitted = _emit(layout, draft_token_ids, accepted, candidates)
            counts = (emitted != PLACEHOLDER_TOKEN_ID).sum(dim=-1).tolist()  # the host sync
            for request, (generator, states) in rewinds.items():
                generator.set_state(states[counts[request]])
        return accepted, candidates

    def _recovery_weights(
        self,
        target_probs: torch.Tensor,
        draft_token_ids: torch.Tensor,
        draft_probs: torch.Tensor | None,
    ) -> torch.Tensor:
        """What a rejected draft's replacement is drawn from, up to a factor: [D, V].

        max(0, p - q), with q one-hot on the draft when `draft_probs` is None. Where it is
        all zero (p <= q everywhere: p == q in exact arithmetic, so no rejection can
        happen, but rounding can still make one) the draw falls back to p.
        """
        if draft_probs is None:
            residual = target_probs.scatter(-1, draft_token_ids.unsqueeze(-1), 0.0)
        else:
            residual = (target_probs - draft_probs.to(target_probs.dtype)).clamp_min(0.0)
        empty = residual.sum(dim=-1, keepdim=True) <= 0  # [D, 1]
        return torch.where(empty, target_probs, residual)


@dataclass(frozen=True)
class _Layout:
    """Where each request's rows lie in the logits [N, V] and the drafts [D].

    Request r owns logits rows first_rows[r] .. first_rows[r] + n_r (drafts, then its
    last row) and drafts first_drafts[r] .. first_drafts[r] + n_r - 1.
    """

    num_draft_tokens: list[int]
    first_rows: list[int]
    first_drafts: list[int]
    first_rows_t: torch.Tensor  # [R]
    draft_rows: torch.Tensor  # [D] the logits row each draft is verified at
    draft_requests: torch.Tensor  # [D]
    draft_positions: torch.Tensor  # [D] index of the draft within its request

    @classmethod
    def of(cls, num_draft_tokens: list[int], device: torch.device) -> _Layout:
        first_drafts = [0, *accumulate(num_draft_tokens)][:-1]
        first_rows = [0, *accumulate(num_verified(n) for n in num_draft_tokens)][:-1]
        num_drafts = sum(num_draft_tokens)
        counts = torch.tensor(num_draft_tokens, dtype=torch.int64, device=device)  # [R]
        requests = torch.arange(len(num_draft_tokens), device=device)  # [R]
        # output_size spares repeat_interleave a device-to-host sync for the result's size.
        draft_requests = requests.repeat_interleave(counts, output_size=num_drafts)  # [D]
        draft_index = torch.arange(num_drafts, device=device)  # [D]
        first_drafts_t = torch.tensor(first_drafts, dtype=torch.int64, device=device)  # [R]
        return cls(
            num_draft_tokens=num_draft_tokens,
            first_rows=first_rows,
            first_drafts=first_drafts,
            first_rows_t=torch.tensor(first_rows, dtype=torch.int64, device=device),
            draft_rows=draft_index + draft_requests,
            draft_requests=draft_requests,
            draft_positions=draft_index - first_drafts_t[draft_requests],
        )


def _draw(
    layout: _Layout,
    generators: Mapping[int, torch.Generator],
    vocab_size: int,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(uniform [D], exponential [N, V]) noise; seeded requests' parts from their generator.

    Unseeded requests share torch's default generator; each seeded request (found by its
    last row, which every request has) overwrites its own slices in the fixed order
    uniforms, then exponentials.
    """
    num_drafts = sum(layout.num_draft_tokens)
    num_rows = sum(num_verified(n) for n in layout.num_draft_tokens)
    uniform = torch.rand(num_drafts, device=device)  # [D]
    noise = torch.empty(num_rows, vocab_size, device=device).exponential_()  # [N, V]
    if generators:
        spans = zip(layout.first_drafts, layout.first_rows, layout.num_draft_tokens, strict=True)
        for first_draft, first_row, n in spans:
            generator = generators.get(first_row + n)
            if generator is not None:
                uniform[first_draft : first_draft + n].uniform_(generator=generator)
                noise[first_row : first_row + num_verified(n)].exponential_(generator=generator)
    # exponential_ may return exactly 0, which would turn w / E into inf or nan (0 / 0).
    return uniform, noise.clamp_min(torch.finfo(noise.dtype).tiny)


def _draw_seeded_rows(
    noise: torch.Tensor, layout: _Layout, generators: Mapping[int, torch.Generator]
) -> dict[int, tuple[torch.Generator, list[torch.Tensor]]]:
    """Overwrite each seeded request's rows of `noise` with draws from its generator, one
    row at a time; request -> (generator, its state before each row and after the last)."""
    rewinds = {}
    spans = zip(layout.first_rows, layout.num_draft_tokens, strict=True)
    for request, (first_row, n) in enumerate(spans):
        generator = generators.get(first_row + n)
        if generator is None:
            continue
        states = []
        for row in range(first_row, first_row + num_verified(n)):
            states.append(generator.get_state())
            noise[row].exponential_(generator=generator)
        states.append(generator.get_state())
        rewinds[request] = (generator, states)
    return rewinds


def _emit(
    layout: _Layout,
    draft_token_ids: torch.Tensor,
    accepted: torch.Tensor,
    candidates: torch.Tensor,
) -> torch.Tensor:
    """[R, max(n_r) + 1]: the accepted prefix of each request's drafts, then the
    candidate of the row after it (the first rejected draft's row, or the last row)."""
    num_reqs = len(layout.num_draft_tokens)
    width = num_verified(max(layout.num_draft_tokens, default=0))
    device = draft_token_ids.device
    index = (layout.draft_requests, layout.draft_positions)
    accepted_grid = torch.zeros(num_reqs, width, dtype=torch.int64, device=device)
    accepted_grid = accepted_grid.index_put(index, accepted.to(torch.int64))  # [R, K + 1]
    num_accepted = accepted_grid.cumprod(dim=-1).sum(dim=-1)  # [R] leading accepted drafts
    drafts = torch.full_like(accepted_grid, PLACEHOLDER_TOKEN_ID)
    drafts = drafts.index_put(index, draft_token_ids)  # [R, K + 1]
    columns = torch.arange(width, device=device)  # [K + 1]
    emitted = drafts.masked_fill(columns >= num_accepted.unsqueeze(-1), PLACEHOLDER_TOKEN_ID)
    target = candidates[layout.first_rows_t + num_accepted]  # [R]
    return emitted.scatter(-1, num_accepted.unsqueeze(-1), target.unsqueeze(-1))


def _check_shapes(
    logits: torch.Tensor,
    num_draft_tokens: list[int],
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
) -> None:
    num_drafts = sum(num_draft_tokens)
    num_rows = sum(num_verified(n) for n in num_draft_tokens)
    if logits.shape[0] != num_rows:
        raise ValueError(
            f"logits must have sum(num_draft_tokens) + len(num_draft_tokens) = {num_rows} "
            f"rows, got {logits.shape[0]}"
        )
    if draft_token_ids.shape != (num_drafts,):
        raise ValueError(
            f"draft_token_ids must have shape ({num_drafts},), got {tuple(draft_token_ids.shape)}"
        )
    if draft_probs is not None and draft_probs.shape != (num_drafts, logits.shape[-1]):
        raise ValueError(
            f"draft_probs must have shape ({num_drafts}, {logits.shape[-1]}), "
            f"got {tuple(draft_probs.shape)}"
        )
