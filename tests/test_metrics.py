"""EngineMetrics: the exposition, parsed back with prometheus_client's own parser, holds the
recorded IterationStats under vLLM's names (``vllm:*`` or ``core:*``) with ``model_name``
and ``engine`` labels, one series per data-parallel engine."""

from __future__ import annotations

import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from core.config import (
    CacheConfig,
    EngineConfig,
    LoRAConfig,
    ModelConfig,
    ObservabilityConfig,
    ParallelConfig,
)
from core.engine.protocol import FinishReason, SchedulerStats, SpecDecodingStats
from core.engine.stats import FinishedRequestStats, IterationStats
from core.metrics import EngineMetrics

MODEL = "SmolLM2-135M-Instruct"

# vLLM's families (prometheus_client's names: counters without _total) and their types.
VLLM_FAMILIES = {
    "num_requests_running": "gauge",
    "num_requests_waiting": "gauge",
    "num_requests_waiting_by_reason": "gauge",
    "kv_cache_usage_perc": "gauge",
    "prefix_cache_queries": "counter",
    "prefix_cache_hits": "counter",
    "external_prefix_cache_queries": "counter",
    "external_prefix_cache_hits": "counter",
    "kv_transfer_blocks": "counter",
    "kv_transfer_bytes": "counter",
    "kv_transfer_failed_loads": "counter",
    "num_preemptions": "counter",
    "mm_cache_queries": "counter",
    "mm_cache_hits": "counter",
    "encoder_inputs_computed": "counter",
    "encoder_cache_usage_perc": "gauge",
    "prompt_tokens": "counter",
    "generation_tokens": "counter",
    "request_success": "counter",
    "iteration_tokens_total": "histogram",
    "time_to_first_token_seconds": "histogram",
    "inter_token_latency_seconds": "histogram",
    "kv_transfer_time_seconds": "histogram",
    "expert_load_imbalance": "gauge",
    "e2e_request_latency_seconds": "histogram",
    "request_queue_time_seconds": "histogram",
    "request_inference_time_seconds": "histogram",
    "request_prefill_time_seconds": "histogram",
    "request_decode_time_seconds": "histogram",
    "request_prompt_tokens": "histogram",
    "request_generation_tokens": "histogram",
    "request_num_preemptions": "histogram",
    "request_params_max_tokens": "histogram",
    "request_params_n": "histogram",
    "cache_config_info": "gauge",
}


def config(prefix: str = "vllm", engines: int = 1, **sections) -> EngineConfig:
    return EngineConfig(
        observability=ObservabilityConfig(metrics_prefix=prefix),
        parallel=ParallelConfig(data_parallel_size=engines),
        **sections,
    )


def samples(metrics: EngineMetrics) -> dict[tuple[str, frozenset], float]:
    """Every sample as {(name, labels): value}."""
    text, _ = metrics.render()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }


def value(metrics: EngineMetrics, name: str, engine: str = "0", **labels: str) -> float:
    key = frozenset({"model_name": MODEL, "engine": engine, **labels}.items())
    return samples(metrics)[(metrics.prefix + ":" + name, key)]


def scheduler_stats(running=0, waiting=0, usage=0.0, queries=0, hits=0, preemptions=0):
    return SchedulerStats(
        num_running=running,
        num_waiting=waiting,
        kv_cache_usage=usage,
        prefix_cache_queries=queries,
        prefix_cache_hits=hits,
        num_preemptions=preemptions,
    )


def step(engine: int = 0, scheduler: SchedulerStats | None = None, **fields) -> IterationStats:
    """An engine step's update (its scheduler stats default to an idle engine's)."""
    return IterationStats(engine, scheduler or scheduler_stats(), **fields)


def finished(
    reason=FinishReason.LENGTH, prompt=4, generated=3, e2e=1.0, phases=(0.1, 0.2, 0.7), **more
):
    queued, prefill, decode = phases
    return FinishedRequestStats(
        finish_reason=reason,
        num_prompt_tokens=prompt,
        num_generation_tokens=generated,
        e2e_latency=e2e,
        queued_time=queued,
        prefill_time=prefill,
        decode_time=decode,
        inference_time=None if prefill is None else prefill + (decode or 0.0),
        **more,
    )


@pytest.mark.parametrize("prefix", ["vllm", "core"])
def test_every_vllm_family_is_exposed_at_zero_under_the_prefix(prefix):
    metrics = EngineMetrics(MODEL, config(prefix))
    text, content_type = metrics.render()
    assert content_type.startswith("text/plain")
    families = {
        f.name: f.type
        for f in text_string_to_metric_families(text.decode())
        if not f.name.endswith("_created")  # prometheus_client's creation-time series
    }
    assert families == {f"{prefix}:{name}": kind for name, kind in VLLM_FAMILIES.items()}
    for reason in ("stop", "length", "abort", "error"):
        assert value(metrics, "request_success_total", finished_reason=reason) == 0
    assert value(metrics, "prompt_tokens_total") == 0
    assert value(metrics, "time_to_first_token_seconds_count") == 0
    assert value(metrics, "iteration_tokens_total_count") == 0


def test_every_series_has_the_model_and_engine_labels():
    metrics = EngineMetrics(MODEL, config())
    for (name, labels), _ in samples(metrics).items():
        labels = dict(labels)
        assert (labels["model_name"], labels["engine"]) == (MODEL, "0"), name


def test_each_data_parallel_engine_has_its_own_series():
    metrics = EngineMetrics(MODEL, config(engines=2))
    metrics.record(step(0, scheduler_stats(running=3, queries=100, hits=40)))
    metrics.record(step(1, scheduler_stats(running=1, queries=10, hits=4)))
    metrics.record(step(1, scheduler_stats(running=2, queries=30, hits=10)))
    assert value(metrics, "num_requests_running", "0") == 3
    assert value(metrics, "num_requests_running", "1") == 2
    # Each engine's cumulative counts grow from its own previous snapshot.
    assert value(metrics, "prefix_cache_queries_total", "0") == 100
    assert value(metrics, "prefix_cache_queries_total", "1") == 30
    assert value(metrics, "prefix_cache_hits_total", "1") == 10


def test_scheduler_stats_set_gauges_and_grow_counters():
    metrics = EngineMetrics(MODEL, config())
    metrics.record(step(scheduler=scheduler_stats(3, 2, 0.25, 100, 40, 1)))
    metrics.record(step(scheduler=scheduler_stats(1, 0, 0.5, 130, 52, 1)))
    assert value(metrics, "num_requests_running") == 1
    assert value(metrics, "num_requests_waiting") == 0
    assert value(metrics, "kv_cache_usage_perc") == 0.5
    assert value(metrics, "prefix_cache_queries_total") == 130
    assert value(metrics, "prefix_cache_hits_total") == 52
    assert value(metrics, "num_preemptions_total") == 1


def test_external_prefix_cache_counts_grow_from_the_connectors_totals():
    metrics = EngineMetrics(MODEL, config())
    for queries, hits, blocks in ((40, 16, 2), (90, 48, 5)):
        stats = scheduler_stats()
        stats.external_prefix_cache_queries, stats.external_prefix_cache_hits = queries, hits
        stats.kv_transfer_blocks = blocks
        metrics.record(step(scheduler=stats))
    assert value(metrics, "external_prefix_cache_queries_total") == 90
    assert value(metrics, "external_prefix_cache_hits_total") == 48
    assert value(metrics, "kv_transfer_blocks_total") == 5


def test_encoder_cache_counts_grow_and_its_usage_follows_the_latest_step():
    metrics = EngineMetrics(MODEL, config())
    for queries, hits, encoded, usage in ((4, 3, 1, 0.5), (6, 4, 2, 0.25)):
        stats = scheduler_stats()
        stats.mm_cache_queries, stats.mm_cache_hits = queries, hits
        stats.num_encoder_inputs, stats.encoder_cache_usage = encoded, usage
        metrics.record(step(scheduler=stats))
    assert value(metrics, "mm_cache_queries_total") == 6
    assert value(metrics, "mm_cache_hits_total") == 4
    assert value(metrics, "encoder_inputs_computed_total") == 2
    assert value(metrics, "encoder_cache_usage_perc") == 0.25


def test_the_expert_imbalance_gauge_follows_the_latest_measurement():
    metrics = EngineMetrics(MODEL, config())
    for measured in (None, 1.8, 1.05, None):  # None: a step that measured nothing new
        stats = scheduler_stats()
        stats.expert_imbalance = measured
        metrics.record(step(scheduler=stats))
    assert value(metrics, "expert_load_imbalance") == 1.05


def test_each_kv_transfer_is_one_observation_of_the_transfer_time_histogram():
    metrics = EngineMetrics(MODEL, config())
    metrics.record(step(kv_transfer_times=[0.0003, 0.02]))
    metrics.record(step(kv_transfer_times=[1.5]))
    metrics.record(step())  # a step with no transfer observes nothing
    assert value(metrics, "kv_transfer_time_seconds_count") == 3
    assert value(metrics, "kv_transfer_time_seconds_sum") == pytest.approx(1.5203)
    assert value(metrics, "kv_transfer_time_seconds_bucket", le="0.0005") == 1
    assert value(metrics, "kv_transfer_time_seconds_bucket", le="0.025") == 2
    assert value(metrics, "kv_transfer_time_seconds_bucket", le="1.0") == 2
    assert value(metrics, "kv_transfer_time_seconds_bucket", le="2.5") == 3


def test_cumulative_count_that_restarts_adds_its_new_value():
    metrics = EngineMetrics(MODEL, config())
    metrics.record(step(scheduler=scheduler_stats(queries=100, hits=40)))
    metrics.record(step(scheduler=scheduler_stats(queries=10, hits=4)))  # a new engine core
    assert value(metrics, "prefix_cache_queries_total") == 110
    assert value(metrics, "prefix_cache_hits_total") == 44


def test_engine_death_drops_every_engines_scheduler_gauges_to_0_and_keeps_the_counts():
    metrics = lora_metrics(2, engines=2)
    metrics.record(step(0, scheduler_stats(running=3, waiting=2, usage=0.5, queries=100)))
    busy = lora_step(1, {"sql": 1}, {"chat": 2})
    busy.scheduler_stats.num_running, busy.scheduler_stats.num_waiting = 1, 2
    metrics.record(busy)
    metrics.record_engine_death()
    for engine in ("0", "1"):
        for gauge in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
            assert value(metrics, gauge, engine) == 0, (gauge, engine)
    assert value(metrics, "prefix_cache_queries_total", "0") == 100
    ((labels, _),) = lora_series(metrics)
    assert labels == lora_labels("2", "", "")


def test_step_tokens_and_latencies_fill_counters_and_histograms():
    metrics = EngineMetrics(MODEL, config())
    metrics.record(
        step(
            num_prompt_tokens=12,
            num_cached_prompt_tokens=8,
            num_generation_tokens=2,
            time_to_first_tokens=[0.03, 0.3],
        )
    )
    metrics.record(step(num_generation_tokens=2, inter_token_latencies=[0.02, 0.6]))
    assert value(metrics, "prompt_tokens_total") == 12
    assert value(metrics, "generation_tokens_total") == 4
    assert value(metrics, "time_to_first_token_seconds_count") == 2
    assert value(metrics, "time_to_first_token_seconds_bucket", le="0.04") == 1
    assert value(metrics, "inter_token_latency_seconds_sum") == pytest.approx(0.62)
    assert value(metrics, "inter_token_latency_seconds_bucket", le="0.025") == 1
    # One observation per step: 12 - 8 uncached prompt tokens + 2 generated, then 2.
    assert value(metrics, "iteration_tokens_total_count") == 2
    assert value(metrics, "iteration_tokens_total_sum") == 8
    assert value(metrics, "iteration_tokens_total_bucket", le="1.0") == 0
    assert value(metrics, "iteration_tokens_total_bucket", le="8.0") == 2


def test_finished_requests_count_by_reason_with_their_phases():
    metrics = EngineMetrics(MODEL, config())
    metrics.record(
        step(
            finished_requests=[
                finished(FinishReason.STOP, prompt=10, generated=5, e2e=0.4),
                finished(FinishReason.LENGTH, prompt=7, generated=16, e2e=3.0),
            ]
        )
    )
    assert value(metrics, "request_success_total", finished_reason="stop") == 1
    assert value(metrics, "request_success_total", finished_reason="length") == 1
    assert value(metrics, "e2e_request_latency_seconds_count") == 2
    assert value(metrics, "e2e_request_latency_seconds_sum") == pytest.approx(3.4)
    assert value(metrics, "e2e_request_latency_seconds_bucket", le="0.5") == 1
    assert value(metrics, "request_queue_time_seconds_sum") == pytest.approx(0.2)
    assert value(metrics, "request_prefill_time_seconds_sum") == pytest.approx(0.4)
    assert value(metrics, "request_decode_time_seconds_sum") == pytest.approx(1.4)
    assert value(metrics, "request_inference_time_seconds_sum") == pytest.approx(1.8)
    assert value(metrics, "request_prompt_tokens_sum") == 17
    assert value(metrics, "request_generation_tokens_sum") == 21
    assert value(metrics, "request_generation_tokens_bucket", le="5.0") == 1


def test_request_params_and_preemptions_are_observed_per_finished_request():
    metrics = EngineMetrics(MODEL, config(model=ModelConfig(max_model_len=60)))
    # One user request with n=2 and max_tokens=5: two samples, the last carries n; the
    # first was preempted once. Then one with no max_tokens preempted 4 times.
    samples_of_n2 = [
        finished(num_preemptions=1, max_tokens_param=5),
        finished(max_tokens_param=5, n_param=2),
    ]
    metrics.record(step(finished_requests=samples_of_n2))
    metrics.record(step(finished_requests=[finished(num_preemptions=4, n_param=1)]))

    def bucket(family: str, le: str) -> float:
        return value(metrics, f"{family}_bucket", le=le)

    assert value(metrics, "request_params_n_count") == 2  # once per user request
    assert value(metrics, "request_params_n_sum") == 3
    assert (bucket("request_params_n", "1.0"), bucket("request_params_n", "2.0")) == (1, 2)
    assert value(metrics, "request_params_max_tokens_count") == 2  # once per sample
    assert value(metrics, "request_params_max_tokens_sum") == 10
    assert bucket("request_params_max_tokens", "2.0") == 0
    assert bucket("request_params_max_tokens", "5.0") == 2
    assert value(metrics, "request_num_preemptions_count") == 3  # every finished sample
    assert value(metrics, "request_num_preemptions_sum") == 5
    assert bucket("request_num_preemptions", "1.0") == 2  # 0 and 1
    assert bucket("request_num_preemptions", "3.0") == 2
    assert bucket("request_num_preemptions", "4.0") == 3


def test_waiting_requests_split_by_reason_and_add_up_to_the_waiting_gauge():
    metrics = EngineMetrics(MODEL, config(engines=2))
    stats = scheduler_stats(waiting=5)
    stats.num_waiting_deferred = 2
    metrics.record(step(1, stats))
    assert value(metrics, "num_requests_waiting_by_reason", "1", reason="capacity") == 3
    assert value(metrics, "num_requests_waiting_by_reason", "1", reason="deferred") == 2
    assert value(metrics, "num_requests_waiting", "1") == 5
    for reason in ("capacity", "deferred"):  # engine 0 reported nothing: its series at 0
        assert value(metrics, "num_requests_waiting_by_reason", "0", reason=reason) == 0
    metrics.record_engine_death()
    for reason in ("capacity", "deferred"):
        assert value(metrics, "num_requests_waiting_by_reason", "1", reason=reason) == 0


def test_aborted_requests_count_without_a_step_or_the_phases_they_never_reached():
    metrics = EngineMetrics(MODEL, config())
    queued_only = finished(FinishReason.ABORT, generated=0, e2e=0.05, phases=(None, None, None))
    metrics.record(IterationStats(0, finished_requests=[queued_only]))
    assert value(metrics, "request_success_total", finished_reason="abort") == 1
    assert value(metrics, "e2e_request_latency_seconds_count") == 1
    assert value(metrics, "request_queue_time_seconds_count") == 0
    assert value(metrics, "request_prefill_time_seconds_count") == 0
    assert value(metrics, "iteration_tokens_total_count") == 0  # no engine step ran


def test_buckets_are_vllms():
    metrics = EngineMetrics(MODEL, config(model=ModelConfig(max_model_len=60)))

    def bounds(family: str) -> list[str]:
        name = f"vllm:{family}_bucket"
        return [dict(labels)["le"] for (n, labels) in samples(metrics) if n == name]

    assert bounds("time_to_first_token_seconds")[:3] == ["0.001", "0.005", "0.01"]
    assert bounds("time_to_first_token_seconds")[-2:] == ["2560.0", "+Inf"]
    assert bounds("e2e_request_latency_seconds")[-2:] == ["7680.0", "+Inf"]
    assert bounds("iteration_tokens_total")[-2:] == ["16384.0", "+Inf"]
    assert bounds("request_prompt_tokens") == ["1.0", "2.0", "5.0", "10.0", "20.0", "50.0", "+Inf"]
    assert bounds("request_params_max_tokens") == bounds("request_prompt_tokens")
    assert bounds("request_params_n") == ["1.0", "2.0", "5.0", "10.0", "20.0", "+Inf"]
    assert bounds("request_num_preemptions") == [
        "1.0", "2.0", "3.0", "4.0", "5.0", "10.0", "20.0", "+Inf"
    ]  # fmt: skip


def test_cache_config_info_shows_the_cache_settings_and_blocks_per_engine():
    cache = CacheConfig(block_size=4, enable_prefix_caching=False)
    model = ModelConfig(max_model_len=99)
    metrics = EngineMetrics(MODEL, config(engines=2, cache=cache, model=model), num_gpu_blocks=321)
    infos = [
        dict(labels) for (name, labels), v in samples(metrics).items()
        if name == "vllm:cache_config_info" and v == 1
    ]  # fmt: skip
    assert sorted(info["engine"] for info in infos) == ["0", "1"]
    for info in infos:
        assert info["model_name"] == MODEL
        assert (info["block_size"], info["num_gpu_blocks"]) == ("4", "321")
        assert info["enable_prefix_caching"] == "False"
        # 320 blocks (block 0 holds no tokens) of 4 tokens; a request of 99 tokens takes 25.
        assert info["kv_cache_size_tokens"] == "1280"
        assert float(info["kv_cache_max_concurrency"]) == 12.8


def test_cache_config_info_capacity_is_unknown_without_the_blocks():
    (info,) = [
        dict(labels) for (name, labels), _ in samples(EngineMetrics(MODEL, config())).items()
        if name == "vllm:cache_config_info"
    ]  # fmt: skip
    assert info["kv_cache_size_tokens"] == info["kv_cache_max_concurrency"] == "None"


def test_two_instances_keep_separate_registries():
    first, second = EngineMetrics(MODEL, config()), EngineMetrics(MODEL, config())
    first.record(step(finished_requests=[finished(FinishReason.STOP)]))
    assert value(first, "request_success_total", finished_reason="stop") == 1
    assert value(second, "request_success_total", finished_reason="stop") == 0


def spec_step(engine: int, drafts: int, tokens: int, accepted: int, per_pos: list[int]):
    stats = scheduler_stats()
    stats.spec_decoding = SpecDecodingStats(
        num_drafts=drafts,
        num_draft_tokens=tokens,
        num_accepted_tokens=accepted,
        num_accepted_tokens_per_pos=per_pos,
    )
    return step(engine, stats)


def test_speculative_counters_appear_with_the_first_speculative_stats_per_engine():
    metrics = EngineMetrics(MODEL, config(engines=2))
    metrics.record(step())
    assert not any("spec_decode" in name for name, _ in samples(metrics))
    metrics.record(spec_step(0, 2, 6, 4, [2, 1, 1]))
    metrics.record(spec_step(1, 1, 3, 3, [1, 1, 1]))
    metrics.record(spec_step(0, 5, 15, 7, [4, 2, 1]))
    assert value(metrics, "spec_decode_num_drafts_total", "0") == 5
    assert value(metrics, "spec_decode_num_drafts_total", "1") == 1
    assert value(metrics, "spec_decode_num_draft_tokens_total", "0") == 15
    assert value(metrics, "spec_decode_num_accepted_tokens_total", "0") == 7
    per_pos = "spec_decode_num_accepted_tokens_per_pos_total"
    assert [value(metrics, per_pos, "0", position=str(i)) for i in range(3)] == [4, 2, 1]


def lora_series(metrics: EngineMetrics) -> list[tuple[dict[str, str], float]]:
    """The (labels, value) of every lora_requests_info series."""
    return [
        (dict(labels), v)
        for (name, labels), v in samples(metrics).items()
        if name == "vllm:lora_requests_info"
    ]


def lora_step(engine: int, running: dict[str, int], waiting: dict[str, int]) -> IterationStats:
    stats = scheduler_stats()
    stats.running_lora_adapters, stats.waiting_lora_adapters = running, waiting
    return step(engine, stats)


def lora_labels(max_lora: str, running: str, waiting: str) -> dict[str, str]:
    return {
        "model_name": MODEL,
        "max_lora": max_lora,
        "running_lora_adapters": running,
        "waiting_lora_adapters": waiting,
    }


def lora_metrics(max_loras: int, engines: int = 1) -> EngineMetrics:
    return EngineMetrics(MODEL, config(engines=engines, lora=LoRAConfig(max_loras=max_loras)))


def test_lora_info_exists_from_the_start_with_no_adapters():
    before = time.time()
    metrics = lora_metrics(3)
    after = time.time()
    ((labels, stamp),) = lora_series(metrics)
    assert labels == lora_labels("3", "", "")
    assert before <= stamp <= after


def test_lora_info_names_the_latest_adapters_sorted_in_one_series():
    metrics = lora_metrics(2)
    metrics.record(lora_step(0, {"sql": 2, "chat": 1}, {"math": 4, "code": 1}))
    ((labels, _),) = lora_series(metrics)
    assert labels == lora_labels("2", "chat,sql", "code,math")
    before = time.time()
    metrics.record(lora_step(0, {"math": 1}, {}))
    after = time.time()
    ((labels, stamp),) = lora_series(metrics)
    assert labels == lora_labels("2", "math", "")
    assert before <= stamp <= after


def test_lora_info_joins_the_adapters_of_every_engine():
    metrics = lora_metrics(2, engines=2)
    metrics.record(lora_step(0, {"sql": 1}, {}))
    metrics.record(lora_step(1, {"chat": 1}, {"sql": 1}))
    metrics.record(lora_step(0, {"math": 1}, {}))
    ((labels, _),) = lora_series(metrics)
    assert labels == lora_labels("2", "chat,math", "sql")


def test_lora_info_is_stamped_again_when_the_adapters_stay_the_same():
    metrics = lora_metrics(1)
    metrics.record(lora_step(0, {"sql": 1}, {}))
    before = time.time()
    metrics.record(lora_step(0, {"sql": 3}, {}))
    ((labels, stamp),) = lora_series(metrics)
    assert labels == lora_labels("1", "sql", "") and stamp >= before


def test_no_lora_info_without_lora():
    metrics = EngineMetrics(MODEL, config())
    metrics.record(lora_step(0, {"sql": 1}, {}))
    assert lora_series(metrics) == []
