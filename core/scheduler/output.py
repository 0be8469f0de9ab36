"""What the scheduler reports to the frontend after each step.

The scheduler is part of the engine core, so these msgspec structs are defined here, below
`core.engine`, which re-exports them in its frontend <-> engine-core contract
(`core.engine.protocol`); frontend code imports them from there. An output carries new
token ids per request, never text: detokenization stays in the frontend process.
"""

from __future__ import annotations

import msgspec

from core.request import FinishReason
from core.worker.contract import LogprobsLists

__all__ = ["EngineCoreOutput", "EngineCoreOutputs", "SchedulerStats"]


class EngineCoreOutput(msgspec.Struct, kw_only=True, array_like=True, omit_defaults=True):
    request_id: str
    new_token_ids: list[int]
    new_logprobs: LogprobsLists | None = None
    new_prompt_logprobs: LogprobsLists | None = None
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None  # the stop token id (stop strings: frontend)
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class SchedulerStats(msgspec.Struct, kw_only=True):
    """The scheduler's state after a step, for logs and metrics."""

    num_running: int
    num_waiting: int
    kv_cache_usage: float
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_preemptions: int

    @property
    def prefix_cache_hit_rate(self) -> float:
        if not self.prefix_cache_queries:
            return 0.0
        return self.prefix_cache_hits / self.prefix_cache_queries


class EngineCoreOutputs(msgspec.Struct, kw_only=True, array_like=True, omit_defaults=True):
    outputs: list[EngineCoreOutput] = msgspec.field(default_factory=list)
    timestamp: float = 0.0
    scheduler_stats: SchedulerStats | None = None
    # Requests the engine finished on its own (e.g. aborted) that the frontend must forget.
    finished_requests: set[str] = msgspec.field(default_factory=set)
