"""Proposers that each break one point of the Proposer contract, for the kit to catch."""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict

from core.spec_decode.interface import ProposalBatch, Proposer


def _repeat_last(batch: ProposalBatch, row: int, count: int) -> list[int]:
    return [int(batch.token_ids[row, batch.num_tokens[row] - 1])] * count


class TooManyDrafts(Proposer):
    """Drafts k + 1 tokens."""

    def propose(self, batch: ProposalBatch) -> list[list[int]]:
        k = batch.num_speculative_tokens
        return [_repeat_last(batch, row, k + 1) for row in batch.propose_rows]


class ReadsPastTheEnd(Proposer):
    """Drafts the token just past each row's known tokens."""

    def propose(self, batch: ProposalBatch) -> list[list[int]]:
        return [[int(batch.token_ids[row, batch.num_tokens[row]])] for row in batch.propose_rows]


class DraftsForEveryRow(Proposer):
    """Ignores propose_rows."""

    def propose(self, batch: ProposalBatch) -> list[list[int]]:
        return [_repeat_last(batch, row, 1) for row in range(len(batch.req_ids))]


class WritesTheBatch(Proposer):
    """Scribbles its drafts into token_ids past each row's end."""

    def propose(self, batch: ProposalBatch) -> list[list[int]]:
        drafts = [_repeat_last(batch, row, 1) for row in batch.propose_rows]
        for row, row_drafts in zip(batch.propose_rows, drafts, strict=True):
            batch.token_ids[row, batch.num_tokens[row]] = row_drafts[0]
        return drafts


class _AnyOptions(BaseModel):
    model_config = ConfigDict(extra="allow")


class AcceptsAnyOption(Proposer):
    """An options model that lets unknown keys through."""

    options_model = _AnyOptions

    def propose(self, batch: ProposalBatch) -> list[list[int]]:
        return [[] for _ in batch.propose_rows]


class RandomDrafts(Proposer):
    """Drafts a random earlier token of each row, from an unseeded generator."""

    def propose(self, batch: ProposalBatch) -> list[list[int]]:
        rng = np.random.default_rng()
        return [
            [int(batch.token_ids[row, rng.integers(batch.num_tokens[row])])]
            for row in batch.propose_rows
        ]
