"""Packing token bitmasks for the trip to the workers (engine-core side).

A grammar fills one int32 row per request; `pack_grammar_bitmask` turns the rows into the
GrammarBitmask of the scheduler <-> worker contract, whose layout `core.worker.contract`
states. Workers unpack and apply it with `core.worker.grammar_bitmask`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from core.worker.contract import BITS_PER_WORD, GrammarBitmask

__all__ = ["bitmask_words", "pack_grammar_bitmask"]


def bitmask_words(vocab_size: int) -> int:
    """Int32 words in a row that covers `vocab_size` token ids."""
    return -(-vocab_size // BITS_PER_WORD)


def pack_grammar_bitmask(req_ids: Sequence[str], bitmask: torch.Tensor) -> GrammarBitmask:
    """Row i of `bitmask` ([len(req_ids), W] int32, on any device) becomes request
    `req_ids[i]`'s row of a GrammarBitmask."""
    if bitmask.dtype != torch.int32 or bitmask.dim() != 2:
        raise ValueError(
            f"bitmask must be a 2-D int32 tensor, got {bitmask.dim()}-D {bitmask.dtype}"
        )
    if bitmask.shape[0] != len(req_ids):
        raise ValueError(f"bitmask has {bitmask.shape[0]} rows for {len(req_ids)} request ids")
    words = bitmask.cpu().numpy().astype("<i4", copy=False)
    return GrammarBitmask(
        req_ids=list(req_ids), words_per_row=int(bitmask.shape[1]), data=words.tobytes()
    )
