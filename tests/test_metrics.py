"""EngineMetrics: the exposition, parsed back with prometheus_client's own parser, holds
the recorded values under the ``core:*`` names with a ``model_name`` label."""

from __future__ import annotations

import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from core import metrics as metrics_module
from core.engine.protocol import SchedulerStats, SpecDecodingStats
from core.metrics import METRICS_PREFIX, EngineMetrics

MODEL = "SmolLM2-135M-Instruct"


def samples(metrics: EngineMetrics) -> dict[tuple[str, frozenset], float]:
    """Every sample as {(name, labels): value}."""
    text, _ = metrics.render()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }


def sample_names(metrics: EngineMetrics) -> set[str]:
    return {name for name, _ in samples(metrics)}


def value(metrics: EngineMetrics, name: str, **labels: str) -> float:
    return samples(metrics)[(name, frozenset({"model_name": MODEL, **labels}.items()))]


def stats(running=0, waiting=0, usage=0.0, queries=0, hits=0, preemptions=0) -> SchedulerStats:
    return SchedulerStats(
        num_running=running,
        num_waiting=waiting,
        kv_cache_usage=usage,
        prefix_cache_queries=queries,
        prefix_cache_hits=hits,
        num_preemptions=preemptions,
    )


@pytest.fixture
def metrics() -> EngineMetrics:
    return EngineMetrics(MODEL)


def test_every_exposed_name_starts_with_the_prefix_setting(metrics):
    names = sample_names(metrics)
    assert names and all(name.startswith(METRICS_PREFIX) for name in names)
    assert "core:prefix_cache_hits_total" in names  # the documented name, spelled out


def test_changing_the_prefix_setting_renames_every_family(monkeypatch):
    monkeypatch.setattr(metrics_module, "METRICS_PREFIX", "probe:")
    names = sample_names(EngineMetrics(MODEL))
    assert names and all(name.startswith("probe:") for name in names)
    assert "probe:prefix_cache_hits_total" in names


def test_every_family_is_exposed_at_zero_before_anything_is_recorded(metrics):
    text, content_type = metrics.render()
    assert content_type.startswith("text/plain")
    families = {
        f.name: f.type
        for f in text_string_to_metric_families(text.decode())
        if not f.name.endswith("_created")  # prometheus_client's creation-time series
    }
    assert families == {
        "core:request_success": "counter",
        "core:prompt_tokens": "counter",
        "core:generation_tokens": "counter",
        "core:prefix_cache_queries": "counter",
        "core:prefix_cache_hits": "counter",
        "core:num_preemptions": "counter",
        "core:num_requests_running": "gauge",
        "core:num_requests_waiting": "gauge",
        "core:kv_cache_usage_perc": "gauge",
        "core:time_to_first_token_seconds": "histogram",
        "core:inter_token_latency_seconds": "histogram",
        "core:e2e_request_latency_seconds": "histogram",
    }
    for reason in ("stop", "length", "abort"):
        assert value(metrics, "core:request_success_total", finished_reason=reason) == 0
    assert value(metrics, "core:time_to_first_token_seconds_count") == 0


def test_scheduler_stats_set_gauges_and_grow_counters(metrics):
    metrics.record_scheduler_stats(stats(3, 2, 0.25, queries=100, hits=40, preemptions=1))
    metrics.record_scheduler_stats(stats(1, 0, 0.5, queries=130, hits=52, preemptions=1))
    assert value(metrics, "core:num_requests_running") == 1
    assert value(metrics, "core:num_requests_waiting") == 0
    assert value(metrics, "core:kv_cache_usage_perc") == 0.5
    assert value(metrics, "core:prefix_cache_queries_total") == 130
    assert value(metrics, "core:prefix_cache_hits_total") == 52
    assert value(metrics, "core:num_preemptions_total") == 1


def test_cumulative_count_that_restarts_adds_its_new_value(metrics):
    metrics.record_scheduler_stats(stats(queries=100, hits=40))
    metrics.record_scheduler_stats(stats(queries=10, hits=4))  # a new engine core
    assert value(metrics, "core:prefix_cache_queries_total") == 110
    assert value(metrics, "core:prefix_cache_hits_total") == 44


def test_finished_requests_count_by_reason_with_tokens_and_latencies(metrics):
    metrics.record_request_finished("stop", 10, 5, ttft_s=0.02, e2e_s=0.3)
    metrics.record_request_finished("length", 7, 16, ttft_s=0.2, e2e_s=3.0)
    metrics.record_request_finished("abort", 4, 0, ttft_s=None, e2e_s=0.05)
    for reason in ("stop", "length", "abort"):
        assert value(metrics, "core:request_success_total", finished_reason=reason) == 1
    assert value(metrics, "core:prompt_tokens_total") == 21
    assert value(metrics, "core:generation_tokens_total") == 21
    # The aborted request produced no token: it has no time to first token.
    assert value(metrics, "core:time_to_first_token_seconds_count") == 2
    assert value(metrics, "core:time_to_first_token_seconds_sum") == pytest.approx(0.22)
    assert value(metrics, "core:time_to_first_token_seconds_bucket", le="0.025") == 1
    assert value(metrics, "core:time_to_first_token_seconds_bucket", le="0.25") == 2
    assert value(metrics, "core:e2e_request_latency_seconds_count") == 3
    assert value(metrics, "core:e2e_request_latency_seconds_sum") == pytest.approx(3.35)
    assert value(metrics, "core:e2e_request_latency_seconds_bucket", le="0.1") == 1
    assert value(metrics, "core:e2e_request_latency_seconds_bucket", le="+Inf") == 3


def test_inter_token_latencies_fill_the_histogram(metrics):
    for seconds in (0.004, 0.03, 0.03, 2.0):
        metrics.record_inter_token(seconds)
    assert value(metrics, "core:inter_token_latency_seconds_count") == 4
    assert value(metrics, "core:inter_token_latency_seconds_sum") == pytest.approx(2.064)
    assert value(metrics, "core:inter_token_latency_seconds_bucket", le="0.005") == 1
    assert value(metrics, "core:inter_token_latency_seconds_bucket", le="0.05") == 3
    assert value(metrics, "core:inter_token_latency_seconds_bucket", le="2.5") == 4


def test_two_instances_keep_separate_registries():
    first, second = EngineMetrics(MODEL), EngineMetrics(MODEL)
    first.record_request_finished("stop", 1, 1, 0.1, 0.1)
    assert value(first, "core:request_success_total", finished_reason="stop") == 1
    assert value(second, "core:request_success_total", finished_reason="stop") == 0


def spec_stats(drafts: int, tokens: int, accepted: int, per_pos: list[int]) -> SchedulerStats:
    snapshot = stats()
    snapshot.spec_decoding = SpecDecodingStats(
        num_drafts=drafts,
        num_draft_tokens=tokens,
        num_accepted_tokens=accepted,
        num_accepted_tokens_per_pos=per_pos,
    )
    return snapshot


def test_speculative_decoding_counters_appear_with_the_first_speculative_stats(metrics):
    metrics.record_scheduler_stats(stats())
    assert not any("spec_decode" in name for name in sample_names(metrics))
    metrics.record_scheduler_stats(spec_stats(2, 6, 4, [2, 1, 1]))
    metrics.record_scheduler_stats(spec_stats(5, 15, 7, [4, 2, 1]))
    assert value(metrics, "core:spec_decode_num_drafts_total") == 5
    assert value(metrics, "core:spec_decode_num_draft_tokens_total") == 15
    assert value(metrics, "core:spec_decode_num_accepted_tokens_total") == 7
    per_pos = "core:spec_decode_num_accepted_tokens_per_pos_total"
    assert [value(metrics, per_pos, position=str(i)) for i in range(3)] == [4, 2, 1]


LORA_INFO = "core:lora_requests_info"


def lora_series(metrics: EngineMetrics) -> list[tuple[dict[str, str], float]]:
    """The (labels, value) of every lora_requests_info series."""
    return [
        (dict(labels), v) for (name, labels), v in samples(metrics).items() if name == LORA_INFO
    ]


def lora_stats(running: dict[str, int], waiting: dict[str, int]) -> SchedulerStats:
    snapshot = stats()
    snapshot.running_lora_adapters, snapshot.waiting_lora_adapters = running, waiting
    return snapshot


def lora_labels(max_lora: str, running: str, waiting: str) -> dict[str, str]:
    return {
        "model_name": MODEL,
        "max_lora": max_lora,
        "running_lora_adapters": running,
        "waiting_lora_adapters": waiting,
    }


def test_lora_info_exists_from_the_start_with_no_adapters():
    before = time.time()
    metrics = EngineMetrics(MODEL, max_loras=3)
    after = time.time()
    ((labels, stamp),) = lora_series(metrics)
    assert labels == lora_labels("3", "", "")
    assert before <= stamp <= after


def test_lora_info_names_the_latest_adapters_sorted_in_one_series():
    metrics = EngineMetrics(MODEL, max_loras=2)
    metrics.record_scheduler_stats(lora_stats({"sql": 2, "chat": 1}, {"math": 4, "code": 1}))
    ((labels, _),) = lora_series(metrics)
    assert labels == lora_labels("2", "chat,sql", "code,math")
    before = time.time()
    metrics.record_scheduler_stats(lora_stats({"math": 1}, {}))
    after = time.time()
    ((labels, stamp),) = lora_series(metrics)
    assert labels == lora_labels("2", "math", "")
    assert before <= stamp <= after


def test_lora_info_is_stamped_again_when_the_adapters_stay_the_same():
    metrics = EngineMetrics(MODEL, max_loras=1)
    metrics.record_scheduler_stats(lora_stats({"sql": 1}, {}))
    before = time.time()
    metrics.record_scheduler_stats(lora_stats({"sql": 3}, {}))
    ((labels, stamp),) = lora_series(metrics)
    assert labels == lora_labels("1", "sql", "") and stamp >= before


def test_no_lora_info_without_max_loras(metrics):
    metrics.record_scheduler_stats(lora_stats({"sql": 1}, {}))
    assert lora_series(metrics) == []
