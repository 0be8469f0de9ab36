"""StatLoggers: a frontend's stat loggers (core.engine.stat_logger), fed its stats.

Each factory, every `core.stat_loggers` plugin's then those the caller passes, builds one
logger per engine core; `listener_of` feeds one logger every engine's stats instead. A plugin that
fails to import, or is neither a StatLoggerBase class nor callable, is logged, shown
failed by `core plugins`, and skipped. A logger that raises is reported once and dropped:
stats never stop an engine.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from core import envs
from core.config import EngineConfig
from core.engine.stat_logger import StatLoggerBase, StatLoggerFactory
from core.engine.stats import IterationStats, StatsListener
from core.plugins.groups import STAT_LOGGERS
from core.plugins.registry import PluginEntry, PluginRegistry, get_registry, shape_error

__all__ = ["StatLoggers", "listener_of", "stat_logger_factories"]

logger = logging.getLogger(__name__)


class StatLoggers:
    """The loggers of one frontend; `record` is its stats listener."""

    def __init__(
        self,
        config: EngineConfig,
        factories: Sequence[StatLoggerFactory] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # (engine index, its logger)
        self._loggers: list[tuple[int, StatLoggerBase]] = [
            (engine, _build(factory, config, engine))
            for factory in factories
            for engine in range(config.parallel.data_parallel_size)
        ]
        self._clock = clock
        self._last_log = clock()

    def __bool__(self) -> bool:
        return bool(self._loggers)

    def record(self, stats: IterationStats) -> None:
        """Hand one update to the loggers of its engine."""
        for engine, stat_logger in list(self._loggers):
            if engine == stats.engine_index:
                self._call(stat_logger, "record", stats.scheduler_stats, stats, stats.engine_index)

    def log_engine_initialized(self) -> None:
        for _, stat_logger in list(self._loggers):
            self._call(stat_logger, "log_engine_initialized")

    def log(self) -> None:
        self._last_log = self._clock()
        for _, stat_logger in list(self._loggers):
            self._call(stat_logger, "log")

    def log_when_due(self) -> None:
        """`log()` once CORE_LOG_STATS_INTERVAL seconds have passed since the last."""
        if self._clock() - self._last_log >= envs.log_stats_interval():
            self.log()

    def _call(self, stat_logger: StatLoggerBase, method: str, *args: Any) -> None:
        try:
            getattr(stat_logger, method)(*args)
        except Exception:
            logger.exception(
                "stat logger %s raised in %s(); it is called no more", type(stat_logger), method
            )
            self._loggers = [(e, s) for e, s in self._loggers if s is not stat_logger]


def listener_of(stat_logger: StatLoggerBase) -> StatsListener:
    """A stats listener (AsyncLLM.stats_listeners) feeding `stat_logger` every engine's
    updates: one logger for all engines."""

    def listen(stats: IterationStats) -> None:
        stat_logger.record(stats.scheduler_stats, stats, stats.engine_index)

    return listen


def stat_logger_factories(
    given: Sequence[StatLoggerFactory] = (), registry: PluginRegistry | None = None
) -> list[StatLoggerFactory]:
    """Every installed `core.stat_loggers` plugin's factory (by entry name), then `given`;
    ValueError for a given one that cannot build a logger."""
    for factory in given:
        if not _is_factory(factory):
            raise ValueError(
                f"stat_loggers entries must be StatLoggerBase classes or factories, got {factory!r}"
            )
    found: dict[str, StatLoggerFactory] = {}

    def use(entry: PluginEntry, value: Any) -> None:
        wrong = None if _is_factory(value) else shape_error(value, StatLoggerBase)
        if wrong is not None:
            raise TypeError(wrong)
        found[entry.name] = value

    (registry or get_registry()).use_each(STAT_LOGGERS, use, "taking the stat logger")
    return [found[name] for name in sorted(found)] + list(given)


def _is_factory(value: Any) -> bool:
    """A StatLoggerBase class, or a callable that is no class (a factory function)."""
    if isinstance(value, type):
        return issubclass(value, StatLoggerBase)
    return callable(value)


def _build(factory: StatLoggerFactory, config: EngineConfig, engine: int) -> StatLoggerBase:
    built = factory(config, engine)
    if not isinstance(built, StatLoggerBase):
        raise ValueError(f"stat logger factory {factory!r} built {built!r}, not a StatLoggerBase")
    return built
