"""Speculator: one worker's speculative decoding, between the model runner and the plugins.

It verifies the drafts of a step with the rejection sampler (building, for every verified
position, the sampling state that position would have without speculation) and asks the
proposer for the next step's drafts, skipping requests the acceptance gate has paused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import torch

from core.sample.interface import Sampler
from core.sample.logprobs import compute_logprobs, gather_logprobs
from core.sample.metadata import SamplingMetadata
from core.spec_decode.gate import AcceptanceGate
from core.spec_decode.interface import (
    PLACEHOLDER_TOKEN_ID,
    ProposalBatch,
    Proposer,
    RejectionSampler,
)
from core.worker.contract import GrammarBitmask, LogprobsLists
from core.worker.grammar_bitmask import apply_grammar_bitmask
from core.worker.input_batch import CachedRequestState

__all__ = ["Speculator"]

MakeMetadata = Callable[[list[CachedRequestState], list[list[int]]], SamplingMetadata]


class Speculator:
    def __init__(
        self,
        proposer: Proposer,
        rejection_sampler: RejectionSampler,
        num_speculative_tokens: int,
    ) -> None:
        self.proposer = proposer
        self.rejection_sampler = rejection_sampler
        self.num_speculative_tokens = num_speculative_tokens
        self.gate = AcceptanceGate(proposer.min_acceptance_rate)

    def verify(
        self,
        sampler: Sampler,
        logits: torch.Tensor,
        states: list[CachedRequestState],
        drafts: list[list[int]],
        bitmask: GrammarBitmask | None,
        make_metadata: MakeMetadata,
    ) -> tuple[list[list[int]], dict[str, LogprobsLists]]:
        """(tokens each request emits, logprobs of those that asked).

        `logits` [sum(n + 1), V] are the target's at each request's n drafts and the
        position after them. Logprobs are the target's raw ones at the emitted positions.
        """
        position_states = [
            s for s, d in zip(states, drafts, strict=True) for _ in range(len(d) + 1)
        ]
        if bitmask is not None:  # structured output: forbidden tokens get -inf
            apply_grammar_bitmask(logits, [s.req_id for s in position_states], bitmask)
        # Position j of a request sees the output it would have had the drafts before j
        # been accepted: penalties, min_tokens and bad words depend on it.
        outputs = [
            s.output_token_ids + d[:j]
            for s, d in zip(states, drafts, strict=True)
            for j in range(len(d) + 1)
        ]
        metadata = make_metadata(position_states, outputs)
        num_drafts = [len(d) for d in drafts]
        draft_ids = torch.tensor(
            [t for d in drafts for t in d], dtype=torch.int64, device=logits.device
        )
        emitted_tensor = self.rejection_sampler(
            sampler.process_logits(logits, metadata), metadata, num_drafts, draft_ids
        )
        emitted = [[t for t in row if t != PLACEHOLDER_TOKEN_ID] for row in emitted_tensor.tolist()]
        for state, n, tokens in zip(states, num_drafts, emitted, strict=True):
            self.gate.observe(state.req_id, n, len(tokens) - 1)
        return emitted, _emitted_logprobs(logits, states, num_drafts, emitted)

    def propose(self, batch: ProposalBatch) -> list[list[int]]:
        """Drafts for the next step, one list per batch row (empty where none)."""
        rows = [int(r) for r in batch.propose_rows if self.gate.allows(batch.req_ids[r])]
        k = self.num_speculative_tokens
        view = dataclasses.replace(
            batch, propose_rows=np.array(rows, dtype=np.int64), num_speculative_tokens=k
        )
        proposed = self.proposer.propose(view)
        _check_proposals(self.proposer, proposed, len(rows), k)
        drafts: list[list[int]] = [[] for _ in batch.req_ids]
        for row, tokens in zip(rows, proposed, strict=True):
            drafts[row] = [int(t) for t in tokens]
        return drafts

    def forget(self, req_ids: Iterable[str]) -> None:
        """Drop what is kept about finished requests."""
        self.gate.forget(req_ids)


def _check_proposals(proposer: Proposer, proposed: Sequence, num_rows: int, k: int) -> None:
    name = type(proposer).__name__
    if len(proposed) != num_rows:
        raise RuntimeError(f"{name}.propose returned {len(proposed)} lists for {num_rows} rows")
    if any(len(tokens) > k for tokens in proposed):
        raise RuntimeError(f"{name}.propose returned more than num_speculative_tokens={k}")


def _emitted_logprobs(
    logits: torch.Tensor,
    states: list[CachedRequestState],
    num_drafts: list[int],
    emitted: list[list[int]],
) -> dict[str, LogprobsLists]:
    """The target's logprobs at each emitted token's position, for requests that asked."""
    wanted = [i for i, s in enumerate(states) if s.sampling_params.logprobs is not None]
    if not wanted:
        return {}
    starts = np.concatenate([[0], np.cumsum(np.array(num_drafts) + 1)[:-1]])
    index = [int(starts[i]) + j for i in wanted for j in range(len(emitted[i]))]
    token_ids = [t for i in wanted for t in emitted[i]]
    k = max(states[i].sampling_params.logprobs or 0 for i in wanted)
    tensors = gather_logprobs(
        compute_logprobs(logits[index]), torch.tensor(token_ids, device=logits.device), k
    )
    result, start = {}, 0
    for i in wanted:
        end = start + len(emitted[i])
        result[states[i].req_id] = LogprobsLists.from_tensors(
            tensors, start, end, states[i].sampling_params.logprobs
        )
        start = end
    return result
