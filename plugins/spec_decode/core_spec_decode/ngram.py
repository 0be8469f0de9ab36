"""The n-gram proposer (prompt lookup): drafts the tokens that followed an earlier copy of
the row's last few tokens.

Semantics are vLLM v1's (`NgramProposer`): for the largest n in [prompt_lookup_min,
prompt_lookup_max] whose suffix (the row's last n tokens) occurs earlier in the row, the
drafts are the up to k tokens that follow the *earliest* such occurrence, stopping at the
row's end. An occurrence may overlap the suffix but must start before it, so it is
always followed by at least one known token. No n matches: no drafts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from core.spec_decode.interface import ProposalBatch, Proposer
from core.spec_decode.selector import validate_options

if TYPE_CHECKING:
    from core.config import SpeculativeConfig
    from core.spec_decode.interface import ProposerContext

__all__ = ["NgramOptions", "NgramProposer"]

DEFAULT_NGRAM = 5
"""vLLM's n when neither bound is given (both bounds then 5)."""


class NgramOptions(BaseModel):
    """`--speculative-config` keys of method "ngram". As in vLLM, a bound given alone sets
    the other one too; neither given: both DEFAULT_NGRAM."""

    model_config = ConfigDict(extra="forbid")

    prompt_lookup_min: int = Field(default=DEFAULT_NGRAM, ge=1, strict=True)
    prompt_lookup_max: int = Field(default=DEFAULT_NGRAM, ge=1, strict=True)

    @model_validator(mode="before")
    @classmethod
    def _one_bound_sets_both(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        given = [key for key in ("prompt_lookup_min", "prompt_lookup_max") if key in data]
        if len(given) == 1:
            other = "prompt_lookup_max" if given[0] == "prompt_lookup_min" else "prompt_lookup_min"
            data = {**data, other: data[given[0]]}
        return data

    @field_validator("prompt_lookup_max")
    @classmethod
    def _max_not_below_min(cls, value: int, info: ValidationInfo) -> int:
        low = info.data.get("prompt_lookup_min")  # absent when it failed its own checks
        if low is not None and value < low:
            raise ValueError(f"must be >= prompt_lookup_min ({low}), got {value}")
        return value


class NgramProposer(Proposer):
    """Prompt-lookup drafts, vectorized over the batch; needs no model and no KV cache."""

    options_model = NgramOptions
    writes_kv_cache = False

    def __init__(self, config: SpeculativeConfig, context: ProposerContext) -> None:
        super().__init__(config, context)
        options = cast(NgramOptions, validate_options(NgramProposer, config))
        self._min_n = options.prompt_lookup_min
        self._max_n = options.prompt_lookup_max

    def propose(self, batch: ProposalBatch) -> list[list[int]]:
        rows = np.asarray(batch.propose_rows, dtype=np.int64)
        if rows.size == 0:
            return []
        num_tokens = np.asarray(batch.num_tokens, dtype=np.int64)[rows]  # [R]
        tokens = batch.token_ids[rows, : int(num_tokens.max())]  # [R, L] (a copy)
        match_end, match_len = _earliest_longest_match(tokens, num_tokens, self._min_n, self._max_n)
        return _drafts_after(tokens, num_tokens, match_end, match_len, batch.num_speculative_tokens)


def _earliest_longest_match(
    tokens: np.ndarray, num_tokens: np.ndarray, min_n: int, max_n: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the end position e and length n of the earliest occurrence of the longest
    matching suffix (n in [min_n, max_n]); n = 0 where none matches.

    Occurrences are indexed by their last position e, so the n-token match is the
    (n-1)-token match at e extended by one comparison further back: one pass over
    j = 0..max_n-1 keeps `alive[r, e]` = tokens[r, e-i] == tokens[r, T-1-i] for all i <= j.
    An occurrence must end by T-2 (start before the suffix, leave a token to draft).
    """
    num_rows, length = tokens.shape
    ends = np.arange(max(length - 1, 0))  # [E] candidate end positions
    alive = ends[None, :] <= (num_tokens - 2)[:, None]  # [R, E]
    match_end = np.zeros(num_rows, dtype=np.int64)
    match_len = np.zeros(num_rows, dtype=np.int64)
    row_index = np.arange(num_rows)
    for j in range(min(max_n, ends.size)):  # an n-token occurrence ends at e >= n - 1
        # Rows with T <= j have no alive end >= j (ends <= T-2), so clipping is harmless.
        target = tokens[row_index, np.maximum(num_tokens - 1 - j, 0)]  # [R]
        alive[:, :j] = False  # the occurrence would start before position 0
        alive[:, j:] &= tokens[:, : ends.size - j] == target[:, None]
        if j + 1 < min_n:
            continue
        found = alive.any(axis=1)  # [R]; longer n come later, so they overwrite
        match_end[found] = alive[found].argmax(axis=1)
        match_len[found] = j + 1
    return match_end, match_len


def _drafts_after(
    tokens: np.ndarray, num_tokens: np.ndarray, match_end: np.ndarray, match_len: np.ndarray, k: int
) -> list[list[int]]:
    """Up to k tokens after each row's match, none past the row's end or without a match."""
    start = match_end + 1  # [R]
    count = np.where(match_len > 0, np.clip(num_tokens - start, 0, k), 0)  # [R]
    positions = np.minimum(start[:, None] + np.arange(k)[None, :], tokens.shape[1] - 1)  # [R, k]
    drafts = np.take_along_axis(tokens, positions, axis=1).tolist()  # [R, k]
    return [row[:n] for row, n in zip(drafts, count.tolist(), strict=True)]
