"""Prometheus metrics of one served model, rendered for ``GET /metrics``.

Every family's name starts with ``METRICS_PREFIX`` (through ``metric_name``), the one
setting later features name their metrics with. Each ``EngineMetrics`` owns its
CollectorRegistry, so two engines in one process (or one test after another) never collide
on prometheus_client's global registry. Every family carries a ``model_name`` label.
SchedulerStats' prefix-cache and preemption numbers are cumulative; they become counters by
adding what grew since the previous snapshot.
"""

from __future__ import annotations

import time

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from core.engine.protocol import SchedulerStats, SpecDecodingStats

__all__ = ["METRICS_PREFIX", "EngineMetrics", "metric_name"]

# vLLM's dashboards read "vllm:*"; core's families are "core:*".
METRICS_PREFIX = "core:"

# Finish reasons reported from the start (at 0) so dashboards see every series.
_FINISH_REASONS = ("stop", "length", "abort")

# Latency buckets in seconds, roughly log-spaced over what a CPU or GPU server sees.
_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_ITL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.5, 1, 2.5, 5, 10)
_E2E_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1800)


def metric_name(name: str) -> str:
    """The exposed name of family `name`: "prefix_cache_hits" -> "core:prefix_cache_hits"."""
    return METRICS_PREFIX + name


class EngineMetrics:
    """The metric families of one model; ``render()`` is the exposition."""

    def __init__(self, model_name: str, max_loras: int | None = None) -> None:
        """`max_loras`: the engine's --max-loras, None when LoRA is not enabled (then
        there is no LoRA family)."""
        self.registry = CollectorRegistry()
        self._model_name = model_name
        self._last_stats: SchedulerStats | None = None

        # Each helper returns the model's child, created now so the series shows 0 at once.
        def counter(name: str, doc: str) -> Counter:
            family = Counter(metric_name(name), doc, ["model_name"], registry=self.registry)
            return family.labels(model_name)

        def gauge(name: str, doc: str) -> Gauge:
            family = Gauge(metric_name(name), doc, ["model_name"], registry=self.registry)
            return family.labels(model_name)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            family = Histogram(
                metric_name(name), doc, ["model_name"], buckets=buckets, registry=self.registry
            )
            return family.labels(model_name)

        self._success = Counter(
            metric_name("request_success"),
            "Finished requests, by finish reason.",
            ["model_name", "finished_reason"],
            registry=self.registry,
        )
        for reason in _FINISH_REASONS:
            self._success.labels(model_name, reason)
        self._prompt_tokens = counter("prompt_tokens", "Prompt tokens of finished requests.")
        self._generation_tokens = counter(
            "generation_tokens", "Generated tokens of finished requests."
        )
        self._cache_queries = counter(
            "prefix_cache_queries", "Prompt tokens looked up in the prefix cache."
        )
        self._cache_hits = counter("prefix_cache_hits", "Prompt tokens found in the prefix cache.")
        self._preemptions = counter("num_preemptions", "Requests preempted (recomputed).")
        self._running = gauge("num_requests_running", "Requests in the running batch.")
        self._waiting = gauge("num_requests_waiting", "Requests waiting to be scheduled.")
        self._kv_usage = gauge(
            "kv_cache_usage_perc", "KV-cache blocks in use, as a fraction (1 = full)."
        )
        self._ttft = histogram(
            "time_to_first_token_seconds", "Arrival to first token.", _TTFT_BUCKETS
        )
        self._itl = histogram(
            "inter_token_latency_seconds", "Time between two tokens.", _ITL_BUCKETS
        )
        self._e2e = histogram("e2e_request_latency_seconds", "Arrival to finish.", _E2E_BUCKETS)
        self._spec: _SpecDecodingMetrics | None = None
        self._lora = (
            None if max_loras is None else _LoRAMetrics(self.registry, model_name, max_loras)
        )

    def record_scheduler_stats(self, stats: SchedulerStats) -> None:
        """Set the gauges to this snapshot and add the growth of its cumulative counts."""
        self._running.set(stats.num_running)
        self._waiting.set(stats.num_waiting)
        self._kv_usage.set(stats.kv_cache_usage)
        last = self._last_stats
        self._cache_queries.inc(
            _growth(stats.prefix_cache_queries, last.prefix_cache_queries if last else None)
        )
        self._cache_hits.inc(
            _growth(stats.prefix_cache_hits, last.prefix_cache_hits if last else None)
        )
        self._preemptions.inc(
            _growth(stats.num_preemptions, last.num_preemptions if last else None)
        )
        if stats.spec_decoding is not None:
            self._record_spec_decoding(stats.spec_decoding, last and last.spec_decoding)
        if self._lora is not None:
            self._lora.record(stats.running_lora_adapters, stats.waiting_lora_adapters)
        self._last_stats = stats

    def _record_spec_decoding(
        self, stats: SpecDecodingStats, last: SpecDecodingStats | None
    ) -> None:
        """vLLM's spec_decode_* counters; created with the first speculative engine's stats."""
        if self._spec is None:
            self._spec = _SpecDecodingMetrics(self.registry, self._model_name, stats)
        self._spec.record(stats, last)

    def record_request_finished(
        self,
        finish_reason: str,
        num_prompt_tokens: int,
        num_generation_tokens: int,
        ttft_s: float | None,
        e2e_s: float,
    ) -> None:
        """Count one finished request; ``ttft_s`` is None when no token was generated."""
        self._success.labels(self._model_name, finish_reason).inc()
        self._prompt_tokens.inc(num_prompt_tokens)
        self._generation_tokens.inc(num_generation_tokens)
        if ttft_s is not None:
            self._ttft.observe(ttft_s)
        self._e2e.observe(e2e_s)

    def record_inter_token(self, seconds: float) -> None:
        self._itl.observe(seconds)

    def render(self) -> tuple[bytes, str]:
        """The text exposition of every family and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _SpecDecodingMetrics:
    """Counters of speculative decoding, named as vLLM names them."""

    def __init__(
        self, registry: CollectorRegistry, model_name: str, stats: SpecDecodingStats
    ) -> None:
        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(metric_name(name), doc, ["model_name", *labels], registry=registry)

        self._drafts = counter("spec_decode_num_drafts", "Drafts verified.").labels(model_name)
        self._draft_tokens = counter(
            "spec_decode_num_draft_tokens", "Draft tokens verified."
        ).labels(model_name)
        self._accepted = counter(
            "spec_decode_num_accepted_tokens", "Draft tokens accepted."
        ).labels(model_name)
        per_pos = counter(
            "spec_decode_num_accepted_tokens_per_pos",
            "Draft tokens accepted, by position in the draft (0-based).",
            ("position",),
        )
        self._per_pos = [
            per_pos.labels(model_name, str(i))
            for i in range(len(stats.num_accepted_tokens_per_pos))
        ]

    def record(self, stats: SpecDecodingStats, last: SpecDecodingStats | None) -> None:
        self._drafts.inc(_growth(stats.num_drafts, last.num_drafts if last else None))
        self._draft_tokens.inc(
            _growth(stats.num_draft_tokens, last.num_draft_tokens if last else None)
        )
        self._accepted.inc(
            _growth(stats.num_accepted_tokens, last.num_accepted_tokens if last else None)
        )
        for i, child in enumerate(self._per_pos):
            before = last.num_accepted_tokens_per_pos[i] if last else None
            child.inc(_growth(stats.num_accepted_tokens_per_pos[i], before))


class _LoRAMetrics:
    """vLLM's `lora_requests_info`: a gauge whose labels say which adapters the running
    and the waiting requests use (sorted names, comma-joined; "" for none) and whose value
    is the wall-clock time of that snapshot. One series at a time: a change of adapters
    replaces the series, so a scrape shows the current set only."""

    def __init__(self, registry: CollectorRegistry, model_name: str, max_loras: int) -> None:
        self._info = Gauge(
            metric_name("lora_requests_info"),
            "The LoRA adapters of the running and the waiting requests.",
            ["model_name", "max_lora", "running_lora_adapters", "waiting_lora_adapters"],
            registry=registry,
        )
        self._fixed = (model_name, str(max_loras))
        self._labels: tuple[str, ...] | None = None
        self.record({}, {})  # the series exists from the start

    def record(self, running: dict[str, int], waiting: dict[str, int]) -> None:
        labels = (*self._fixed, ",".join(sorted(running)), ",".join(sorted(waiting)))
        if self._labels is not None and labels != self._labels:
            self._info.remove(*self._labels)
        self._labels = labels
        self._info.labels(*labels).set(time.time())


def _growth(now: int, before: int | None) -> int:
    """How much a cumulative count grew; a smaller count means it restarted from 0."""
    if before is None or now < before:
        return now
    return now - before
