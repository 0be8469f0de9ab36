"""Token bitmasks: packing them for the trip to the workers, and masking logits with them.

A bitmask row holds one bit per token id: bit j of int32 word j // 32 (bit 0 the least
significant) allows token j. On the wire (`GrammarBitmask.data`) the words are little-endian,
so the bytes read least significant bit first are the token ids in order. This module needs
only torch and numpy: workers apply masks without importing xgrammar.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from core.scheduler.output import GrammarBitmask

__all__ = [
    "allowed_token_mask",
    "apply_grammar_bitmask",
    "bitmask_words",
    "grammar_bitmask_tensor",
    "pack_grammar_bitmask",
]

_BITS_PER_WORD = 32


def bitmask_words(vocab_size: int) -> int:
    """Int32 words in a row that covers `vocab_size` token ids."""
    return -(-vocab_size // _BITS_PER_WORD)


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
    shifts = torch.arange(_BITS_PER_WORD, dtype=torch.int32, device=bitmask.device)
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

    `logits` [N, V] holds one row per request of `sample_req_ids`, in that order. Only the
    rows of requests named in `bitmask` change; a bitmask row whose request does not sample
    here is ignored.
    """
    row_of = {req_id: row for row, req_id in enumerate(sample_req_ids)}
    pairs = [(row_of[r], i) for i, r in enumerate(bitmask.req_ids) if r in row_of]
    if not pairs:
        return
    rows = torch.tensor([row for row, _ in pairs], device=logits.device)
    words = grammar_bitmask_tensor(bitmask)[[i for _, i in pairs]]  # [R, W]
    allowed = allowed_token_mask(words.to(logits.device), logits.shape[-1])  # [R, V]
    logits[rows] = logits[rows].masked_fill(~allowed, float("-inf"))
