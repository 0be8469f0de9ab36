"""StatsLogger: one line per interval while the engine steps, nothing in between."""

from __future__ import annotations

import logging

from core.engine.protocol import SchedulerStats
from core.engine.stats import IterationStats
from core.entrypoints.openai.stats_logger import StatsLogger


def record(logger: StatsLogger, stats: IterationStats) -> None:
    logger.record(stats.scheduler_stats, stats, stats.engine_index)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def step(running: int, queries: int, hits: int, prompt: int, generated: int) -> IterationStats:
    state = SchedulerStats(
        num_running=running, num_waiting=1, kv_cache_usage=0.25,
        prefix_cache_queries=queries, prefix_cache_hits=hits, num_preemptions=0,
    )  # fmt: skip
    return IterationStats(
        engine_index=0,
        scheduler_stats=state,
        num_prompt_tokens=prompt,
        num_generation_tokens=generated,
    )


def test_one_line_per_interval_with_rates_since_the_previous_line(caplog):
    clock = Clock()
    logger = StatsLogger(interval_s=10.0, clock=clock)
    caplog.set_level(logging.INFO, logger="core.entrypoints.openai.stats_logger")
    record(logger, step(2, queries=100, hits=50, prompt=100, generated=0))
    clock.now += 5
    record(logger, step(2, queries=100, hits=50, prompt=0, generated=20))
    assert caplog.messages == []  # within the interval: nothing yet
    clock.now += 5
    record(logger, step(3, queries=100, hits=50, prompt=0, generated=30))
    # 10 s: 100 prompt tokens, 50 generated; 50 of 100 prompt tokens from the cache.
    assert caplog.messages == [
        "Engine: Avg prompt throughput: 10.0 tokens/s, Avg generation throughput: 5.0 tokens/s, "
        "Running: 3 reqs, Waiting: 1 reqs, KV cache usage: 25.0%, Prefix cache hit rate: 50.0%, "
        "Preemptions: 0"
    ]
    clock.now += 20
    record(logger, step(1, queries=140, hits=50, prompt=40, generated=40))
    # Since the last line: 40 new queries, no new hit, over 20 s.
    assert caplog.messages[-1].startswith(
        "Engine: Avg prompt throughput: 2.0 tokens/s, Avg generation throughput: 2.0 tokens/s, "
        "Running: 1 reqs"
    )
    assert "Prefix cache hit rate: 0.0%" in caplog.messages[-1]


def test_a_multimodal_engine_logs_its_encoder_cache_hit_rate_since_the_last_line(caplog):
    clock = Clock()
    logger = StatsLogger(interval_s=1.0, clock=clock)
    caplog.set_level(logging.INFO, logger="core.entrypoints.openai.stats_logger")
    for mm_queries, mm_hits in ((4, 3), (8, 4)):
        clock.now += 1
        stats = step(1, queries=0, hits=0, prompt=0, generated=1)
        stats.scheduler_stats.mm_cache_queries = mm_queries
        stats.scheduler_stats.mm_cache_hits = mm_hits
        record(logger, stats)
    assert caplog.messages[0].endswith("Preemptions: 0, MM cache hit rate: 75.0%")
    assert caplog.messages[1].endswith("MM cache hit rate: 25.0%")  # 1 of the 4 new


def test_aborts_without_an_engine_step_count_but_never_log_alone(caplog):
    clock = Clock()
    logger = StatsLogger(interval_s=1.0, clock=clock)
    caplog.set_level(logging.INFO, logger="core.entrypoints.openai.stats_logger")
    clock.now += 5
    record(logger, IterationStats(engine_index=0))  # a request aborted by the frontend
    assert caplog.messages == []
