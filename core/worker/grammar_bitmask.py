"""Masking logits with a structured-output GrammarBitmask, on the worker side.

The engine core packs each step's allowed tokens into a GrammarBitmask (layout in
`core.worker.contract`); the model runner unpacks it here and sets every forbidden
token's logit to -inf before sampling. Only torch and numpy: workers never import xgrammar.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from core.worker.contract import BITS_PER_WORD, GrammarBitmask

__all__ = ["allowed_token_mask", "apply_grammar_bitmask", "grammar_bitmask_tensor"]


def grammar_bitmask_tensor(bitmask: GrammarBitmask) -> torch.Tensor:
    """The rows of `bitmask` as an int32 tensor [len(req_ids), words_per_row] on the CPU."""
    num_rows, width = len(bitmask.req_ids), bitmask.words_per_row
    if width < 1 or len(bitmask.data) != num_rows * width * 4:
        raise ValueError(
            f"grammar bitmask data has {len(bitmask.data)} bytes, expected {num_rows} rows of "
            f"{width} int32 words"
        )
    # astype copies into native order, and the copy is writable (bytes are not).
    words = np.frombuffer(bitmask.data, dtype="<i4").astype(np.int32)
    return torch.from_numpy(words).view(num_rows, width)


def allowed_token_mask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Unpack `bitmask` [R, W] int32 into a bool mask [R, vocab_size] of allowed tokens.

    Ids beyond the row's W * 32 bits are not allowed; bits beyond `vocab_size` are ignored.
    """
    shifts = torch.arange(BITS_PER_WORD, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1  # [R, W, 32]; >> sign-extends, & 1 drops it
    allowed = bits.view(bitmask.shape[0], -1).bool()  # [R, W * 32]
    if allowed.shape[1] >= vocab_size:
        return allowed[:, :vocab_size]
    missing = vocab_size - allowed.shape[1]
    return torch.nn.functional.pad(allowed, (0, missing), value=False)


def apply_grammar_bitmask(
    logits: torch.Tensor, sample_req_ids: Sequence[str], bitmask: GrammarBitmask
) -> None:
    """Set to -inf, in place, every token a request's grammar does not allow.

    `logits` [N, V] holds one row per entry of `sample_req_ids`, in that order; a request
    verifying drafts has one entry per verified position, and its i-th logits row takes
    its i-th bitmask row. Only the rows of requests named in `bitmask` change; bitmask rows
    with no logits row are ignored.
    """
    row_of = _occurrences(sample_req_ids)
    pairs = [(row_of[key], i) for i, key in enumerate(_keyed(bitmask.req_ids)) if key in row_of]
    if not pairs:
        return
    rows = torch.tensor([row for row, _ in pairs], device=logits.device)
    words = grammar_bitmask_tensor(bitmask)[[i for _, i in pairs]]  # [R, W]
    allowed = allowed_token_mask(words.to(logits.device), logits.shape[-1])  # [R, V]
    logits[rows] = logits[rows].masked_fill(~allowed, float("-inf"))


def _keyed(req_ids: Sequence[str]) -> list[tuple[str, int]]:
    """(request id, how many times it occurred before) of each entry."""
    seen: dict[str, int] = {}
    keys = []
    for req_id in req_ids:
        keys.append((req_id, seen.get(req_id, 0)))
        seen[req_id] = keys[-1][1] + 1
    return keys


def _occurrences(req_ids: Sequence[str]) -> dict[tuple[str, int], int]:
    return {key: row for row, key in enumerate(_keyed(req_ids))}
