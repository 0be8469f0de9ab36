"""StatsLogger: the server's periodic log line of the engine's load, as vLLM's (turned off
with --disable-log-stats), and the reference StatLoggerBase (core.engine.stat_logger).

It records the IterationStats of every engine step (all engines': one logger) and logs
at most one line per interval: prompt and generation throughput since the previous line,
running and waiting requests, KV-cache usage, and the prefix-cache hit rate and
preemptions since the previous line (SchedulerStats' counts are cumulative). Stats only
arrive while the engine steps, so an idle server logs nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from core.engine.protocol import SchedulerStats
from core.engine.stat_logger import StatLoggerBase
from core.engine.stats import IterationStats

if TYPE_CHECKING:
    from core.config import EngineConfig

__all__ = ["LOG_STATS_INTERVAL_S", "StatsLogger"]

logger = logging.getLogger(__name__)

LOG_STATS_INTERVAL_S = 10.0  # vLLM's default interval


class StatsLogger(StatLoggerBase):
    def __init__(
        self,
        config: EngineConfig | None = None,
        engine_index: int = 0,
        interval_s: float = LOG_STATS_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._since = clock()
        self._num_prompt_tokens = 0
        self._num_generation_tokens = 0
        self._logged: SchedulerStats | None = None  # the engine's state at the last line
        self._latest: SchedulerStats | None = None

    def log_engine_initialized(self) -> None:
        """Nothing: `core serve` says when it is ready."""

    def record(
        self,
        scheduler_stats: SchedulerStats | None,
        iteration_stats: IterationStats | None,
        engine_idx: int = 0,
    ) -> None:
        """Count the step's tokens; log once the interval has passed (so an idle engine,
        whose stats do not come, logs nothing: `log` has nothing to do)."""
        if iteration_stats is None:
            return
        self._num_prompt_tokens += iteration_stats.num_prompt_tokens
        self._num_generation_tokens += iteration_stats.num_generation_tokens
        if scheduler_stats is not None:
            self._latest = scheduler_stats
        now = self._clock()
        latest = self._latest
        if latest is None or now - self._since < self.interval_s:
            return
        logger.info(self._line(latest, now - self._since))
        self._since, self._logged = now, latest
        self._num_prompt_tokens = self._num_generation_tokens = 0

    def _line(self, stats: SchedulerStats, elapsed_s: float) -> str:
        before = self._logged
        queries = stats.prefix_cache_queries - (before.prefix_cache_queries if before else 0)
        hits = stats.prefix_cache_hits - (before.prefix_cache_hits if before else 0)
        preemptions = stats.num_preemptions - (before.num_preemptions if before else 0)
        mm_queries = stats.mm_cache_queries - (before.mm_cache_queries if before else 0)
        mm_hits = stats.mm_cache_hits - (before.mm_cache_hits if before else 0)
        # Only a multimodal engine ever queries its encoder cache.
        mm = f", MM cache hit rate: {mm_hits / mm_queries:.1%}" if mm_queries else ""
        return (
            f"Engine: Avg prompt throughput: {self._num_prompt_tokens / elapsed_s:.1f} "
            f"tokens/s, Avg generation throughput: "
            f"{self._num_generation_tokens / elapsed_s:.1f} tokens/s, "
            f"Running: {stats.num_running} reqs, Waiting: {stats.num_waiting} reqs, "
            f"KV cache usage: {stats.kv_cache_usage:.1%}, "
            f"Prefix cache hit rate: {hits / queries if queries else 0.0:.1%}, "
            f"Preemptions: {preemptions}{mm}"
        )
