"""What the benchmarks report: dataclasses with a JSON-ready `to_dict()` and a `table()`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Percentiles:
    """Mean, median and 99th percentile of a sample (NaN when the sample is empty)."""

    mean: float
    median: float
    p99: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Percentiles:
        """Summary of `values`; p99 interpolates linearly between ranks (numpy's default)."""
        if len(values) == 0:  # e.g. every request failed, or one output token: no gaps
            return cls(math.nan, math.nan, math.nan)
        array = np.asarray(values, dtype=np.float64)
        return cls(float(array.mean()), float(np.median(array)), float(np.percentile(array, 99)))


def json_safe(value: Any) -> Any:
    """NaN (undefined) and infinities become None: JSON has no spelling for them."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def _number(value: float | int) -> str:
    if isinstance(value, int):
        return str(value)
    return "n/a" if math.isnan(value) else f"{value:,.2f}"


def _render(title: str, rows: list[tuple[str, str]]) -> str:
    width = max(len(label) for label, _ in rows)
    value_width = max(len(value) for _, value in rows)
    rule = "=" * (width + value_width + 2)
    body = [f"{label:<{width}}  {value:>{value_width}}" for label, value in rows]
    return "\n".join([f" {title} ".center(len(rule), "="), *body, rule])


class _Report:
    """Shared `to_dict` and `table`: scalars one per row, Percentiles as mean/median/p99."""

    _title = ""

    def to_dict(self) -> dict[str, Any]:
        return json_safe(asdict(self))  # type: ignore[call-overload]

    def table(self) -> str:
        rows: list[tuple[str, str]] = []
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            label = f.metadata.get("label", f.name)
            if isinstance(value, Percentiles):
                rows += [(f"{stat} {label}", _number(getattr(value, stat))) for stat in
                         ("mean", "median", "p99")]  # fmt: skip
            elif isinstance(value, int | float):
                rows.append((label, _number(value)))
        rows += self._extra_rows()
        return _render(self._title, rows)

    def _extra_rows(self) -> list[tuple[str, str]]:
        return []


def _labelled(label: str, **kwargs: Any) -> Any:
    return field(metadata={"label": label}, **kwargs)


@dataclass
class ThroughputResult(_Report):
    """Offline throughput: every prompt submitted at once through `LLM.generate`."""

    _title = "Throughput"
    num_requests: int = _labelled("requests")
    duration_s: float = _labelled("duration (s)")
    requests_per_s: float = _labelled("requests/s")
    prompt_tokens: int = _labelled("prompt tokens")
    output_tokens: int = _labelled("output tokens")
    output_tokens_per_s: float = _labelled("output tokens/s")
    total_tokens_per_s: float = _labelled("total tokens/s")
    # Speculative decoding over the measured requests (None: speculation is off).
    acceptance_rate: float | None = _labelled("draft acceptance rate", default=None)
    mean_accepted_length: float | None = _labelled("mean accepted length", default=None)


@dataclass
class LatencyResult(_Report):
    """One batch at a time: per-request TTFT, time per output token after the first, e2e."""

    _title = "Latency"
    batch_size: int = _labelled("batch size")
    input_len: int = _labelled("input tokens")
    output_len: int = _labelled("output tokens")
    num_iters: int = _labelled("iterations")
    ttft_ms: Percentiles = _labelled("TTFT (ms)")
    tpot_ms: Percentiles = _labelled("TPOT (ms)")
    e2e_ms: Percentiles = _labelled("E2E (ms)")
    # Speculative decoding over the measured requests (None: speculation is off).
    acceptance_rate: float | None = _labelled("draft acceptance rate", default=None)
    mean_accepted_length: float | None = _labelled("mean accepted length", default=None)


@dataclass
class ServeResult(_Report):
    """An HTTP load test. Throughputs count successful requests over the whole run.

    `client_overhead_ms` is the load generator's own CPU time per streamed token, measured
    against a server that answers instantly (None when not measured); `errors` maps each
    distinct failure message to how many requests failed with it.
    """

    _title = "Serving"
    num_requests: int = _labelled("requests")
    num_failed: int = _labelled("failed requests")
    duration_s: float = _labelled("duration (s)")
    prompt_tokens: int = _labelled("prompt tokens")
    output_tokens: int = _labelled("output tokens")
    request_throughput: float = _labelled("requests/s")
    output_throughput: float = _labelled("output tokens/s")
    total_token_throughput: float = _labelled("total tokens/s")
    ttft_ms: Percentiles = _labelled("TTFT (ms)")
    itl_ms: Percentiles = _labelled("ITL (ms)")
    tpot_ms: Percentiles = _labelled("TPOT (ms)")
    e2e_ms: Percentiles = _labelled("E2E (ms)")
    client_overhead_ms: float | None = _labelled("client CPU per token (ms)", default=None)
    errors: dict[str, int] = field(default_factory=dict)

    def client_load(self) -> float | None:
        """Fraction of the run the client's CPU was busy with tokens (None: not measured).

        Near 0 means the client kept up with ease; near 1 means it was the bottleneck.
        """
        if self.client_overhead_ms is None or self.duration_s <= 0:
            return None
        return self.client_overhead_ms * self.output_tokens / (self.duration_s * 1000.0)

    def _extra_rows(self) -> list[tuple[str, str]]:
        load = self.client_load()
        rows = [] if load is None else [("client busy (share of run)", f"{load:.2%}")]
        return rows + [(f"error x{count}", message[:60]) for message, count in self.errors.items()]


__all__ = ["LatencyResult", "Percentiles", "ServeResult", "ThroughputResult", "json_safe"]
