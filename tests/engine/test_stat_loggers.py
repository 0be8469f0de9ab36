"""Stat loggers: a `core.stat_loggers` plugin installed as a distribution, and loggers given
to LLM, get every engine step's stats, `log_engine_initialized` once and `log()` every
CORE_LOG_STATS_INTERVAL; one per engine core; a logger that raises is dropped, never the
engine."""

from __future__ import annotations

import json

import pytest
from plugin_sources import STAT_RECORDS_ENTRY_POINTS, records_stat_logger
from tiny_engine_checkpoint import engine_kwargs, write_tiny_checkpoint

from core import LLM, SamplingParams
from core.config import EngineConfig, ParallelConfig
from core.engine.protocol import SchedulerStats
from core.engine.stat_logger import StatLoggerBase
from core.engine.stat_loggers import StatLoggers, listener_of, stat_logger_factories
from core.engine.stats import IterationStats

PARAMS = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)


class Recording(StatLoggerBase):
    def __init__(self, config: EngineConfig, engine_index: int = 0) -> None:
        self.engine_index = engine_index
        self.calls: list[tuple] = []

    def record(self, scheduler_stats, iteration_stats, engine_idx=0) -> None:
        self.calls.append(("record", scheduler_stats, iteration_stats, engine_idx))

    def log_engine_initialized(self) -> None:
        self.calls.append(("initialized",))

    def log(self) -> None:
        self.calls.append(("log",))


class Raising(Recording):
    records = 0  # over every instance

    def record(self, scheduler_stats, iteration_stats, engine_idx=0) -> None:
        Raising.records += 1
        raise RuntimeError("broken logger")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))


def test_plugins_and_given_loggers_get_every_step_and_log_on_interval(
    model_dir, site, fresh_registry, tmp_path, monkeypatch
):
    site.add("acme-stat-records", STAT_RECORDS_ENTRY_POINTS, records_stat_logger())
    records = tmp_path / "records.jsonl"
    monkeypatch.setenv("CORE_TEST_STAT_RECORDS", str(records))
    monkeypatch.setenv("CORE_LOG_STATS_INTERVAL", "0.000001")
    built: list[Recording] = []

    def factory(config: EngineConfig, engine_index: int) -> Recording:
        built.append(Recording(config, engine_index))
        return built[-1]

    llm = LLM(**engine_kwargs(model_dir), stat_loggers=[factory, Raising])
    (output,) = llm.generate(["w1 w2"], PARAMS, use_tqdm=False)
    (given,) = built
    steps = [c for c in given.calls if c[0] == "record"]
    assert given.calls[0] == ("initialized",) and ("log",) in given.calls
    # Every step's stats: the state after it, and all three generated tokens in total.
    assert all(
        isinstance(s, SchedulerStats) and isinstance(i, IterationStats) for _, s, i, _ in steps
    )
    assert sum(i.num_generation_tokens for _, _, i, _ in steps) == len(output.outputs[0].token_ids)
    assert steps[-1][1].num_running == 0 and {c[3] for c in steps} == {0}
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    assert [line["call"] for line in lines[:2]] == ["init", "initialized"]
    plugin_steps = [line for line in lines if line["call"] == "record"]
    assert len(plugin_steps) == len(steps) and {"log"} <= {line["call"] for line in lines}
    # The raising logger was called once, then dropped; the engine serves on.
    (again,) = llm.generate(["w1 w2"], PARAMS, use_tqdm=False)
    assert again.outputs[0].token_ids == output.outputs[0].token_ids
    assert Raising.records == 1


def test_each_engine_core_has_its_own_logger_and_a_listener_feeds_one_all():
    config = EngineConfig(parallel=ParallelConfig(data_parallel_size=2))
    per_engine: list[Recording] = []

    def factory(config: EngineConfig, engine_index: int) -> Recording:
        per_engine.append(Recording(config, engine_index))
        return per_engine[-1]

    loggers, shared = StatLoggers(config, [factory]), Recording(config)
    listen = listener_of(shared)
    for engine in (1, 0, 1):
        loggers.record(IterationStats(engine_index=engine))
        listen(IterationStats(engine_index=engine))
    assert [s.engine_index for s in per_engine] == [0, 1]
    assert [[c[3] for c in s.calls] for s in per_engine] == [[0], [1, 1]]
    assert [c[3] for c in shared.calls] == [1, 0, 1]


def test_what_cannot_build_a_logger_is_refused():
    with pytest.raises(ValueError, match="stat_loggers entries must be StatLoggerBase"):
        stat_logger_factories([int])
