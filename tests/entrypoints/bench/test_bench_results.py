"""Percentiles by hand, JSON-safe dicts and readable tables of the benchmark results."""

from __future__ import annotations

import json
import math

import pytest

from core.entrypoints.bench.results import (
    LatencyResult,
    Percentiles,
    ServeResult,
    ThroughputResult,
)


def test_percentiles_of_one_to_a_hundred():
    # p99 sits at rank 0.99 * 99 = 98.01 of the sorted values: 99 + 0.01 * (100 - 99)
    assert Percentiles.of(list(range(1, 101))) == Percentiles(50.5, 50.5, pytest.approx(99.01))


def test_percentiles_of_an_unsorted_even_sample():
    # sorted 1 2 3 4: median (2 + 3) / 2; p99 at rank 2.97: 3 + 0.97 * (4 - 3)
    assert Percentiles.of([4.0, 1.0, 3.0, 2.0]) == Percentiles(2.5, 2.5, pytest.approx(3.97))


def test_percentiles_of_nothing_are_nan_and_null_in_json():
    empty = Percentiles.of([])
    assert all(math.isnan(v) for v in (empty.mean, empty.median, empty.p99))
    result = LatencyResult(1, 16, 1, 2, Percentiles.of([5.0]), empty, Percentiles.of([9.0]))
    data = result.to_dict()
    assert data["tpot_ms"] == {"mean": None, "median": None, "p99": None}
    json.dumps(data, allow_nan=False)
    assert "n/a" in result.table()


def _serve_result(**overrides) -> ServeResult:
    ms = Percentiles(10.0, 9.0, 30.0)
    fields = dict(
        num_requests=8, num_failed=1, duration_s=10.0, prompt_tokens=700, output_tokens=1000,
        request_throughput=0.7, output_throughput=100.0, total_token_throughput=170.0,
        ttft_ms=ms, itl_ms=ms, tpot_ms=ms, e2e_ms=ms, errors={"HTTP 500: boom": 1},
    )  # fmt: skip
    return ServeResult(**{**fields, **overrides})


def test_client_load_is_the_share_of_the_run_spent_on_tokens():
    # 0.5 ms per token x 1000 tokens = 0.5 s of a 10 s run
    assert _serve_result(client_overhead_ms=0.5).client_load() == pytest.approx(0.05)
    assert _serve_result().client_load() is None


def test_serve_table_is_aligned_and_names_every_figure():
    table = _serve_result(client_overhead_ms=0.5).table()
    lines = table.splitlines()
    assert len({len(line) for line in lines}) == 1  # one width: columns line up
    for label in ("failed requests", "median ITL (ms)", "p99 TTFT (ms)", "output tokens/s"):
        assert label in table
    assert "client busy (share of run)" in table and "5.00%" in table
    assert "error x1" in table and "HTTP 500: boom" in table


def test_throughput_to_dict_holds_every_field():
    result = ThroughputResult(4, 2.0, 2.0, 64, 32, 16.0, 48.0)
    assert result.to_dict() == {
        "num_requests": 4, "duration_s": 2.0, "requests_per_s": 2.0, "prompt_tokens": 64,
        "output_tokens": 32, "output_tokens_per_s": 16.0, "total_tokens_per_s": 48.0,
        "acceptance_rate": None, "mean_accepted_length": None,
    }  # fmt: skip
    assert "total tokens/s" in result.table() and "48.00" in result.table()
    assert "acceptance" not in result.table()  # speculation off: no such rows


def test_tables_show_the_speculation_figures_when_present():
    result = ThroughputResult(4, 2.0, 2.0, 64, 32, 16.0, 48.0, 0.75, 3.5)
    table = result.table()
    assert "draft acceptance rate" in table and "0.75" in table
    assert "mean accepted length" in table and "3.50" in table
