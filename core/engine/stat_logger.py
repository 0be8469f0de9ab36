"""The StatLoggerBase extension point (vLLM v1's interface): what the frontend measures of
its engines, handed to loggers as it is measured.

A stat logger is a `core.stat_loggers` plugin, or passed to `AsyncLLM.start(...,
stat_loggers=[...])` / `LLM(stat_loggers=[...])`: a StatLoggerBase subclass, or any
`(config, engine_index)` factory of one (core.engine.stat_loggers builds them). The
reference implementation is `core serve`'s periodic log line,
core.entrypoints.openai.stats_logger.StatsLogger; the Prometheus metrics of /metrics
(core.metrics) read the same stats.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING

from core.engine.protocol import SchedulerStats
from core.engine.stats import IterationStats

if TYPE_CHECKING:
    from core.config import EngineConfig

__all__ = ["StatLoggerBase", "StatLoggerFactory"]


class StatLoggerBase(ABC):
    """A consumer of one engine core's stats, in the frontend process. Contract:

    - `__init__(config, engine_index)`: once per engine core (its data-parallel index; 0
      with one engine), before the engine core starts.
    - `log_engine_initialized()`: once, when the engine core is up and serving.
    - `record(scheduler_stats, iteration_stats, engine_idx)`: for every update of that
      engine, in order, on the frontend's output path (keep it quick): an engine step
      (`scheduler_stats` its state after the step, cumulative counts included, and
      `iteration_stats` what the step did: tokens, latencies, finished requests), or
      requests the frontend aborted itself (`scheduler_stats` None).
    - `log()`: every CORE_LOG_STATS_INTERVAL seconds (10) while the engine serves; under
      `LLM`, between steps, at most that often. Write what has accumulated.
    A logger that raises is reported in the log and called no more; the engine goes on.
    """

    @abstractmethod
    def __init__(self, config: EngineConfig, engine_index: int = 0) -> None:
        """Build the logger of engine `engine_index` of an engine of `config`."""

    @abstractmethod
    def record(
        self,
        scheduler_stats: SchedulerStats | None,
        iteration_stats: IterationStats | None,
        engine_idx: int = 0,
    ) -> None:
        """Take one update of engine `engine_idx`."""

    @abstractmethod
    def log_engine_initialized(self) -> None:
        """The engine core is up."""

    def log(self) -> None:  # optional: a logger may write as it records
        """Write what accumulated since the last call."""


StatLoggerFactory = type[StatLoggerBase] | Callable[["EngineConfig", int], StatLoggerBase]
"""What builds one engine's logger: `factory(config, engine_index)`."""
