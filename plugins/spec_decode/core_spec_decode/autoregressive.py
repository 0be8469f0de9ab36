"""Greedy drafting by a causal LM that runs inside the worker's forward context.

Shared by the draft-model and layer-skip proposers: a catch-up forward over the tokens the
proposer has not seen (for its own KV cache), whose last logits give each row's first
draft, then one single-token forward per further draft, each feeding the previous draft.
Drafts are argmaxes (deterministic: the rejection sampler treats them as one-hot, which
keeps sampling exact at any temperature).
"""

from __future__ import annotations

from abc import abstractmethod

import numpy as np
import torch

from core.forward_context import set_forward_context
from core.spec_decode.interface import ProposalBatch, Proposer

__all__ = ["AutoregressiveProposer"]


class AutoregressiveProposer(Proposer):
    writes_kv_cache = True

    @abstractmethod
    def catch_up_starts(self, batch: ProposalBatch) -> np.ndarray:
        """[R] where each row's catch-up forward starts; it ends at num_committed_tokens
        (a start equal to the end: the row needs none)."""

    @abstractmethod
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """[T] token ids at [T] positions -> logits [T, V], inside a forward context."""

    @torch.inference_mode()
    def propose(self, batch: ProposalBatch) -> list[list[int]]:
        starts = self.catch_up_starts(batch)
        counts = batch.num_committed_tokens - starts  # [R]
        rows = np.repeat(np.arange(len(counts)), counts)  # [T]
        if len(rows) == 0:
            return [[] for _ in batch.propose_rows]
        offsets = np.arange(len(rows)) - np.repeat(np.cumsum(counts) - counts, counts)
        positions = starts[rows] + offsets
        logits = self._run(batch, rows, positions)  # [T, V]
        propose = batch.propose_rows
        if len(propose) == 0:
            return []
        last = np.cumsum(counts)[propose] - 1  # each proposing row's last committed token
        first = logits[torch.from_numpy(last)].argmax(dim=-1)  # [P]
        return self._continue(batch, propose, first)

    def _continue(
        self, batch: ProposalBatch, propose: np.ndarray, first: torch.Tensor
    ) -> list[list[int]]:
        """Each row's first draft, then k - 1 more, one forward per draft, stopping a row
        where its drafts could no longer be verified under max_model_len."""
        num_tokens = batch.num_tokens[propose]  # [P]
        room = batch.token_ids.shape[1] - num_tokens - 1  # drafts at num_tokens.. must fit
        limits = np.clip(room, 0, batch.num_speculative_tokens)  # [P]
        drafts = torch.zeros(len(propose), max(int(limits.max()), 1), dtype=torch.int64)
        drafts[:, 0] = first.cpu()
        for j in range(1, int(limits.max(initial=0))):
            active = np.flatnonzero(limits > j)  # rows needing draft j + 1
            positions = num_tokens[active] - 1 + j  # where draft j goes in
            logits = self._run(batch, propose[active], positions, drafts[active, j - 1])
            drafts[active, j] = logits.argmax(dim=-1).cpu()
        return [drafts[i, :limit].tolist() for i, limit in enumerate(limits)]

    def _run(
        self,
        batch: ProposalBatch,
        rows: np.ndarray,
        positions: np.ndarray,
        input_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits of a forward over (rows, positions); input ids from the batch by default."""
        device = self.context.device
        if input_ids is None:
            input_ids = torch.from_numpy(batch.token_ids[rows, positions])
        with set_forward_context(batch.forward_context(rows, positions)):
            return self.forward(input_ids.to(device), torch.from_numpy(positions).to(device))
