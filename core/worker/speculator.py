"""Speculator: one worker's speculative decoding, between the model runner and the plugins.

It verifies the drafts of a step with the rejection sampler (building, for every verified
position, the sampling state that position would have without speculation) and asks the
proposer for the next step's drafts, skipping requests the acceptance gate has paused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np
import torch

from core.forward_context import ForwardContext
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
from core.spec_decode.verification import num_accepted, num_verified
from core.worker.contract import GrammarBitmask, LogprobsLists
from core.worker.grammar_bitmask import apply_grammar_bitmask
from core.worker.input_batch import CachedRequestState, InputBatch

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
            s for s, d in zip(states, drafts, strict=True) for _ in range(num_verified(len(d)))
        ]
        if bitmask is not None:  # structured output: forbidden tokens get -inf
            apply_grammar_bitmask(logits, [s.req_id for s in position_states], bitmask)
        # Position j of a request sees the output it would have had the drafts before j
        # been accepted: penalties, min_tokens and bad words depend on it.
        outputs = [
            s.output_token_ids + d[:j]
            for s, d in zip(states, drafts, strict=True)
            for j in range(num_verified(len(d)))
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
            self.gate.observe(state.req_id, n, num_accepted(len(tokens)))
        return emitted, _emitted_logprobs(logits, states, num_drafts, emitted)

    def propose(
        self,
        batch: InputBatch,
        sample_rows: np.ndarray,
        seq_lens: np.ndarray,
        forward_context: Callable[[np.ndarray, np.ndarray], ForwardContext],
    ) -> list[list[int]]:
        """Drafts for the next step, one list per batch row (empty where none): for the
        rows that sampled (`sample_rows`) and that the acceptance gate lets draft, from the
        batch after this step's forward (over `seq_lens` tokens per row)."""
        view = self._proposal_batch(batch, sample_rows, seq_lens, forward_context)
        proposed = self.proposer.propose(view)
        _check_proposals(self.proposer, proposed, view)
        drafts: list[list[int]] = [[] for _ in view.req_ids]
        for row, tokens in zip(view.propose_rows.tolist(), proposed, strict=True):
            drafts[row] = [int(t) for t in tokens]
        return drafts

    def _proposal_batch(
        self,
        batch: InputBatch,
        sample_rows: np.ndarray,
        seq_lens: np.ndarray,
        forward_context: Callable[[np.ndarray, np.ndarray], ForwardContext],
    ) -> ProposalBatch:
        """The batch as the proposer sees it: a row that sampled committed all its tokens,
        the others (prefill chunks) what the forward computed."""
        num_reqs = batch.num_reqs
        committed = seq_lens.copy()
        committed[sample_rows] = batch.num_tokens[sample_rows]
        states = batch.rows[:num_reqs]
        req_ids = [s.req_id for s in states]
        # Asking the gate counts a paused request one step down: once per step.
        drafting = [r for r in sample_rows.tolist() if self.gate.allows(req_ids[r])]
        return ProposalBatch(
            req_ids=req_ids,
            token_ids=batch.token_ids[:num_reqs],
            num_tokens=batch.num_tokens[:num_reqs],
            num_computed_tokens=batch.num_computed_tokens[:num_reqs],
            num_committed_tokens=committed,
            propose_rows=np.array(drafting, dtype=np.int64),
            sampling_params=[s.sampling_params for s in states],
            num_speculative_tokens=self.num_speculative_tokens,
            forward_context=forward_context,
        )

    def forget(self, req_ids: Iterable[str]) -> None:
        """Drop what is kept about finished requests."""
        self.gate.forget(req_ids)


def _check_proposals(proposer: Proposer, proposed: Sequence, batch: ProposalBatch) -> None:
    name, num_rows = type(proposer).__name__, len(batch.propose_rows)
    k = batch.num_speculative_tokens
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
    starts = np.concatenate([[0], np.cumsum(num_verified(np.array(num_drafts)))[:-1]])
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
