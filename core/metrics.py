"""Prometheus metrics of one served model, rendered for ``GET /metrics``.

Names, label names and buckets are vLLM's, so dashboards and autoscalers built for vLLM
read core unchanged: a family is ``{prefix}:{name}`` with the prefix of
``--metrics-prefix`` ("vllm" by default, or "core"), and each series carries ``model_name``
and ``engine`` (the data-parallel engine index, "0" with one engine; every engine has its
own series). prometheus_client exposes counters with a ``_total`` suffix. Every series
exists (at 0) from the start, so a dashboard never shows a hole for "nothing yet".

Each EngineMetrics owns its CollectorRegistry, so two engines in one process (or one test
after another) never collide on prometheus_client's global registry. Updates are
IterationStats (core.engine.stats), one per engine step and one per batch of requests the
frontend aborted; a step's SchedulerStats counts (prefix cache, preemptions, speculative
decoding) are cumulative per engine and become counters by adding what grew since that
engine's previous snapshot.
"""

from __future__ import annotations

import time
from typing import TypeVar

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from core.config import EngineConfig
from core.engine.protocol import FinishReason, SchedulerStats, SpecDecodingStats
from core.engine.stats import FinishedRequestStats, IterationStats
from core.kv_cache.budget import kv_cache_capacity

__all__ = ["EngineMetrics"]

_LABELS = ("model_name", "engine")
_Family = TypeVar("_Family", Counter, Gauge, Histogram)

# vLLM's buckets, so histogram quantiles compare across the two servers.
_TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
_ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
_REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
_ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
_N_BUCKETS = (1, 2, 5, 10, 20)
_PREEMPTION_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
# num_requests_waiting_by_reason's reasons (core.scheduler.waiting_reasons): they add up
# to num_requests_waiting.
_CAPACITY, _DEFERRED = "capacity", "deferred"
# One KV transfer: a host-memory copy takes under a millisecond, a disk or network one
# of a long prompt seconds.
_KV_TRANSFER_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip

# FinishedRequestStats field -> (family, help): one histogram each, observed for every
# finished request that reached the phase (a None duration is not observed).
_REQUEST_TIMES = {
    "e2e_latency": ("e2e_request_latency_seconds", "Histogram of e2e request latency in seconds."),
    "queued_time": (
        "request_queue_time_seconds", "Histogram of time spent in WAITING phase for request."
    ),
    "inference_time": (
        "request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request."
    ),
    "prefill_time": (
        "request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request."
    ),
    "decode_time": (
        "request_decode_time_seconds", "Histogram of time spent in DECODE phase for request."
    ),
}  # fmt: skip
_REQUEST_TOKENS = {
    "num_prompt_tokens": ("request_prompt_tokens", "Number of prefill tokens processed."),
    "num_generation_tokens": (
        "request_generation_tokens", "Number of generation tokens processed."
    ),
}  # fmt: skip


class EngineMetrics:
    """The metric families of one model served by `config`'s engines; `record` is the
    AsyncLLM stats listener, `render()` the exposition."""

    def __init__(
        self, model_name: str, config: EngineConfig, num_gpu_blocks: int | None = None
    ) -> None:
        """`num_gpu_blocks`: each engine's KV blocks, for cache_config_info (None: unknown)."""
        self.registry = CollectorRegistry()
        self.prefix = config.observability.metrics_prefix
        self._model_name = model_name
        self._engines = [str(i) for i in range(config.parallel.data_parallel_size)]
        self._last_stats: dict[int, SchedulerStats] = {}
        self._spec: _SpecDecodingMetrics | None = None
        self._lora = (
            None if config.lora is None else _LoRAMetrics(self, model_name, config.lora.max_loras)
        )
        self._scheduler_families()
        self._request_families(config.model.max_model_len)
        self._cache_config_info(config, num_gpu_blocks)

    def name(self, family: str) -> str:
        """The exposed name of `family`: "prefix_cache_hits" -> "vllm:prefix_cache_hits"."""
        return f"{self.prefix}:{family}"

    def _family(self, kind: type[_Family], family: str, doc: str, **kwargs) -> _Family:
        """A family labelled (model_name, engine) with every engine's series at 0."""
        made = kind(self.name(family), doc, _LABELS, registry=self.registry, **kwargs)
        for engine in self._engines:
            made.labels(self._model_name, engine)
        return made

    def _scheduler_families(self) -> None:
        self._running = self._family(
            Gauge, "num_requests_running", "Number of requests in model execution batches."
        )
        self._waiting = self._family(
            Gauge, "num_requests_waiting", "Number of requests waiting to be processed."
        )
        self._waiting_by_reason = Gauge(
            self.name("num_requests_waiting_by_reason"),
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
            "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA "
            "budget, KV transfer, grammar compilation). Sum of all reasons equals "
            f"{self.name('num_requests_waiting')}.",
            [*_LABELS, "reason"],
            registry=self.registry,
        )
        self._set_waiting_by_reason(self._engines, 0, 0)
        self._kv_usage = self._family(
            Gauge, "kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        )
        self._cache_queries = self._family(
            Counter,
            "prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        )
        self._cache_hits = self._family(
            Counter, "prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        self._external_queries = self._family(
            Counter,
            "external_prefix_cache_queries",
            "External prefix cache queries from KV connector cross-instance cache sharing, "
            "in terms of number of queried tokens.",
        )
        self._external_hits = self._family(
            Counter,
            "external_prefix_cache_hits",
            "External prefix cache hits from KV connector cross-instance cache sharing, "
            "in terms of number of cached tokens.",
        )
        self._transfer_counters = [
            (self._family(Counter, name, doc), field)
            for name, field, doc in (
                ("kv_transfer_blocks", "kv_transfer_blocks", "KV blocks a KV connector moved."),
                ("kv_transfer_bytes", "kv_transfer_bytes", "Bytes of KV a KV connector moved."),
                ("kv_transfer_failed_loads", "kv_transfer_failed_loads",
                 "KV loads that failed; their requests recomputed their prompts."),
            )
        ]  # fmt: skip
        self._transfer_time = self._family(
            Histogram,
            "kv_transfer_time_seconds",
            "Histogram of the time of one KV connector transfer (a load, save or send).",
            buckets=_KV_TRANSFER_BUCKETS,
        )
        self._expert_imbalance = self._family(
            Gauge,
            "expert_load_imbalance",
            "With --enable-eplb: tokens on the busiest expert-parallel rank over the mean per "
            "rank, in the current load window (1 means balanced).",
        )
        self._preemptions = self._family(
            Counter, "num_preemptions", "Cumulative number of preemption from the engine."
        )
        self._mm_queries = self._family(
            Counter,
            "mm_cache_queries",
            "Multimodal cache queries: lookups of an item's encoder output, in items.",
        )
        self._mm_hits = self._family(
            Counter,
            "mm_cache_hits",
            "Multimodal cache hits: items whose encoder output was already computed.",
        )
        self._encoder_inputs = self._family(
            Counter, "encoder_inputs_computed", "Multimodal items the encoder computed."
        )
        self._encoder_usage = self._family(
            Gauge,
            "encoder_cache_usage_perc",
            "Encoder cache usage: the share held by items a request still needs (1 = full).",
        )
        self._iteration_tokens = self._family(
            Histogram,
            "iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            buckets=_ITERATION_TOKEN_BUCKETS,
        )

    def _request_families(self, max_model_len: int | None) -> None:
        self._prompt_tokens = self._family(
            Counter, "prompt_tokens", "Number of prefill tokens processed."
        )
        self._generation_tokens = self._family(
            Counter, "generation_tokens", "Number of generation tokens processed."
        )
        self._success = Counter(
            self.name("request_success"),
            "Count of successfully processed requests.",
            [*_LABELS, "finished_reason"],
            registry=self.registry,
        )
        for engine in self._engines:
            for reason in FinishReason:
                self._success.labels(self._model_name, engine, str(reason))
        self._ttft = self._family(
            Histogram,
            "time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            buckets=_TTFT_BUCKETS,
        )
        self._itl = self._family(
            Histogram,
            "inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            buckets=_ITL_BUCKETS,
        )
        self._request_histograms = {
            field: self._family(Histogram, family, doc, buckets=_REQUEST_LATENCY_BUCKETS)
            for field, (family, doc) in _REQUEST_TIMES.items()
        }
        token_buckets = _1_2_5_buckets(max_model_len)
        for field, (family, doc) in _REQUEST_TOKENS.items():
            self._request_histograms[field] = self._family(
                Histogram, family, doc, buckets=token_buckets
            )
        # Per finished request, observed unless None (see FinishedRequestStats).
        self._request_histograms |= {
            "num_preemptions": self._family(
                Histogram, "request_num_preemptions",
                "Histogram of the number of preemptions of each finished request.",
                buckets=_PREEMPTION_BUCKETS,
            ),
            "max_tokens_param": self._family(
                Histogram, "request_params_max_tokens",
                "Histogram of the max_tokens request parameter.", buckets=token_buckets,
            ),
            "n_param": self._family(
                Histogram, "request_params_n", "Histogram of the n request parameter.",
                buckets=_N_BUCKETS,
            ),
        }  # fmt: skip

    def _cache_config_info(self, config: EngineConfig, num_gpu_blocks: int | None) -> None:
        """vLLM's cache_config_info: a gauge at 1 whose labels are the cache settings and
        what each engine's blocks hold ("None" while unknown)."""
        info = {key: str(value) for key, value in config.cache.model_dump().items()}
        capacity = (None, None)
        if num_gpu_blocks is not None and config.model.max_model_len is not None:
            capacity = kv_cache_capacity(
                num_gpu_blocks, config.cache.block_size, config.model.max_model_len
            )
        info["num_gpu_blocks"] = str(num_gpu_blocks)
        info["kv_cache_size_tokens"], info["kv_cache_max_concurrency"] = map(str, capacity)
        gauge = Gauge(
            self.name("cache_config_info"),
            "Information of the LLMEngine CacheConfig",
            [*_LABELS, *info],
            registry=self.registry,
        )
        for engine in self._engines:
            gauge.labels(self._model_name, engine, *info.values()).set(1)

    # -- recording ------------------------------------------------------------------------

    def record(self, stats: IterationStats) -> None:
        """Take one update: an engine step (its SchedulerStats set) or aborted requests."""
        labels = (self._model_name, str(stats.engine_index))
        if stats.scheduler_stats is not None:
            self._record_scheduler_stats(stats.engine_index, stats.scheduler_stats)
            self._iteration_tokens.labels(*labels).observe(stats.num_tokens)
        self._prompt_tokens.labels(*labels).inc(stats.num_prompt_tokens)
        self._generation_tokens.labels(*labels).inc(stats.num_generation_tokens)
        for seconds in stats.time_to_first_tokens:
            self._ttft.labels(*labels).observe(seconds)
        for seconds in stats.inter_token_latencies:
            self._itl.labels(*labels).observe(seconds)
        for seconds in stats.kv_transfer_times:
            self._transfer_time.labels(*labels).observe(seconds)
        for finished in stats.finished_requests:
            self._record_finished(labels, finished)

    def _record_finished(self, labels: tuple[str, str], finished: FinishedRequestStats) -> None:
        self._success.labels(*labels, str(finished.finish_reason)).inc()
        for field, histogram in self._request_histograms.items():
            value = getattr(finished, field)
            if value is not None:
                histogram.labels(*labels).observe(value)

    def _record_scheduler_stats(self, engine_index: int, stats: SchedulerStats) -> None:
        """Set the gauges to this snapshot and add the growth of its cumulative counts."""
        labels = (self._model_name, str(engine_index))
        self._running.labels(*labels).set(stats.num_running)
        self._waiting.labels(*labels).set(stats.num_waiting)
        deferred = stats.num_waiting_deferred
        self._set_waiting_by_reason([labels[1]], stats.num_waiting - deferred, deferred)
        self._kv_usage.labels(*labels).set(stats.kv_cache_usage)
        self._encoder_usage.labels(*labels).set(stats.encoder_cache_usage)
        if stats.expert_imbalance is not None:
            self._expert_imbalance.labels(*labels).set(stats.expert_imbalance)
        last = self._last_stats.get(engine_index)
        for counter, field in (
            (self._cache_queries, "prefix_cache_queries"),
            (self._cache_hits, "prefix_cache_hits"),
            (self._external_queries, "external_prefix_cache_queries"),
            (self._external_hits, "external_prefix_cache_hits"),
            *self._transfer_counters,
            (self._preemptions, "num_preemptions"),
            (self._mm_queries, "mm_cache_queries"),
            (self._mm_hits, "mm_cache_hits"),
            (self._encoder_inputs, "num_encoder_inputs"),
        ):
            before = None if last is None else getattr(last, field)
            counter.labels(*labels).inc(_growth(getattr(stats, field), before))
        if stats.spec_decoding is not None:
            if self._spec is None:  # the first speculative engine's stats create the families
                self._spec = _SpecDecodingMetrics(self, stats.spec_decoding)
            self._spec.record(labels, stats.spec_decoding, last and last.spec_decoding)
        if self._lora is not None:
            self._lora.record(engine_index, stats)
        self._last_stats[engine_index] = stats

    def record_engine_death(self) -> None:
        """The engines are gone: every engine's gauges of the scheduler's state (requests
        running and waiting, KV-cache usage, LoRA adapters in use) fall to 0, since a dead
        engine runs nothing and its requests have been failed. Kept at their last values,
        they would tell an autoscaler or an alert on queue length that work is still in
        progress; dropped, the series would leave holes. Counters and histograms keep
        what they counted."""
        for engine in self._engines:
            labels = (self._model_name, engine)
            for gauge in (self._running, self._waiting, self._kv_usage, self._encoder_usage):
                gauge.labels(*labels).set(0)
        self._set_waiting_by_reason(self._engines, 0, 0)
        if self._lora is not None:
            self._lora.clear()

    def _set_waiting_by_reason(self, engines: list[str], capacity: int, deferred: int) -> None:
        for engine in engines:
            for reason, count in ((_CAPACITY, capacity), (_DEFERRED, deferred)):
                self._waiting_by_reason.labels(self._model_name, engine, reason).set(count)

    def render(self) -> tuple[bytes, str]:
        """The text exposition of every family and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _SpecDecodingMetrics:
    """Counters of speculative decoding, named and labelled as vLLM's."""

    def __init__(self, metrics: EngineMetrics, stats: SpecDecodingStats) -> None:
        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(metrics.name(name), doc, [*_LABELS, *labels], registry=metrics.registry)

        self._drafts = counter("spec_decode_num_drafts", "Number of spec decoding drafts.")
        self._draft_tokens = counter("spec_decode_num_draft_tokens", "Number of draft tokens.")
        self._accepted = counter("spec_decode_num_accepted_tokens", "Number of accepted tokens.")
        self._per_pos = counter(
            "spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position.",
            ("position",),
        )
        self._num_positions = len(stats.num_accepted_tokens_per_pos)

    def record(
        self, labels: tuple[str, str], stats: SpecDecodingStats, last: SpecDecodingStats | None
    ) -> None:
        self._drafts.labels(*labels).inc(_growth(stats.num_drafts, last and last.num_drafts))
        self._draft_tokens.labels(*labels).inc(
            _growth(stats.num_draft_tokens, last and last.num_draft_tokens)
        )
        self._accepted.labels(*labels).inc(
            _growth(stats.num_accepted_tokens, last and last.num_accepted_tokens)
        )
        for i in range(self._num_positions):
            before = last.num_accepted_tokens_per_pos[i] if last else None
            self._per_pos.labels(*labels, str(i)).inc(
                _growth(stats.num_accepted_tokens_per_pos[i], before)
            )


class _LoRAMetrics:
    """vLLM's `lora_requests_info`: a gauge whose labels say which adapters the running
    and the waiting requests of all engines use (sorted names, comma-joined; "" for none)
    and whose value is the wall-clock time of that snapshot. One series at a time: a change
    of adapters replaces the series, so a scrape shows the current set only."""

    def __init__(self, metrics: EngineMetrics, model_name: str, max_loras: int) -> None:
        self._info = Gauge(
            metrics.name("lora_requests_info"),
            "Running stats on lora requests.",
            ["model_name", "max_lora", "running_lora_adapters", "waiting_lora_adapters"],
            registry=metrics.registry,
        )
        self._fixed = (model_name, str(max_loras))
        self._labels: tuple[str, ...] | None = None
        # engine index -> (running adapters, waiting adapters) of its latest snapshot
        self._adapters: dict[int, tuple[set[str], set[str]]] = {}
        self._show()  # the series exists from the start

    def record(self, engine_index: int, stats: SchedulerStats) -> None:
        running, waiting = set(stats.running_lora_adapters), set(stats.waiting_lora_adapters)
        self._adapters[engine_index] = (running, waiting)
        self._show()

    def clear(self) -> None:
        """No adapter is in use any more (the engines died)."""
        self._adapters.clear()
        self._show()

    def _show(self) -> None:
        running = set().union(*(r for r, _ in self._adapters.values()))
        waiting = set().union(*(w for _, w in self._adapters.values()))
        labels = (*self._fixed, ",".join(sorted(running)), ",".join(sorted(waiting)))
        if self._labels is not None and labels != self._labels:
            self._info.remove(*self._labels)
        self._labels = labels
        self._info.labels(*labels).set(time.time())


def _1_2_5_buckets(max_value: int | None) -> tuple[int, ...]:
    """vLLM's token-count buckets: 1, 2, 5, 10, 20, 50... up to `max_value` (the context
    length; 1, 2, 5 when it is unknown)."""
    buckets: list[int] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > (max_value or 5):
                return tuple(buckets)
            buckets.append(value)
        exponent += 1


def _growth(now: float, before: float | None) -> float:
    """How much a cumulative count grew; a smaller count means it restarted from 0."""
    if before is None or now < before:
        return now
    return now - before
