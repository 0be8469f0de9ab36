"""Speculative decoding over a measured span: the engine's cumulative counts taken before
and after it, and their difference, so warm-up requests and earlier runs do not count."""

from __future__ import annotations

from typing import TYPE_CHECKING

from core.scheduler.output import SpecDecodingStats

if TYPE_CHECKING:
    from core.entrypoints.llm import LLM


def spec_decoding_stats(llm: LLM) -> SpecDecodingStats | None:
    """The engine's counts since it started (None: speculation is off)."""
    return llm.engine.core.scheduler.make_stats().spec_decoding


def stats_between(
    before: SpecDecodingStats | None, after: SpecDecodingStats | None
) -> SpecDecodingStats | None:
    """The drafts verified between two snapshots of one engine (None: speculation off)."""
    if before is None or after is None:
        return None
    return SpecDecodingStats(
        num_drafts=after.num_drafts - before.num_drafts,
        num_draft_tokens=after.num_draft_tokens - before.num_draft_tokens,
        num_accepted_tokens=after.num_accepted_tokens - before.num_accepted_tokens,
        num_accepted_tokens_per_pos=[
            a - b
            for a, b in zip(
                after.num_accepted_tokens_per_pos, before.num_accepted_tokens_per_pos, strict=True
            )
        ],
    )


class SpeculationMeter:
    """Started before a measured span; `stats()` is what the engine verified since."""

    def __init__(self, llm: LLM) -> None:
        self._llm = llm
        self._before = spec_decoding_stats(llm)

    def stats(self) -> SpecDecodingStats | None:
        return stats_between(self._before, spec_decoding_stats(self._llm))

    def figures(self) -> dict[str, float | None]:
        """The results' `acceptance_rate` and `mean_accepted_length` since the start (both
        None when speculation is off)."""
        stats = self.stats()
        if stats is None:
            return {"acceptance_rate": None, "mean_accepted_length": None}
        return {
            "acceptance_rate": stats.acceptance_rate,
            "mean_accepted_length": stats.mean_accepted_length,
        }


__all__ = ["SpeculationMeter", "spec_decoding_stats", "stats_between"]
