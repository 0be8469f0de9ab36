"""GEMM ceilings per dtype: each engine row's "fraction of bound" and its FLOP-bound target
use the ceiling of the dtype it ran in; a GEMM torch cannot run here shows "—"; a dtype
too slow for 2048^3 is timed at the probe size instead; the JSON carries every ceiling."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks import ceilings, report
from benchmarks.ceilings import Ceilings, GemmCeiling, ModelSize

# 100 M parameters: a batched bound is GEMM ops/s / 2e8 tokens/s.
MODEL = ModelSize(100_000_000, 400_000_000, 80_000_000)


def _ceilings(int8: GemmCeiling | None = None) -> Ceilings:
    """float32 100 GFLOP/s (bound 500 tok/s), bfloat16 700 GFLOP/s (bound 3,500 tok/s)."""
    return Ceilings(2, 20.0, 100.0, MODEL, GemmCeiling(700.0, 2048), int8)


def _w1_row(total: float, how: str) -> dict[str, object]:
    return {"how": how, "requests_per_s": 1.0, "output_tokens_per_s": 2.0,
            "total_tokens_per_s": total}  # fmt: skip


def _results() -> report.Results:
    return {
        "W1": {
            "core": _w1_row(1750.0, "LLM.generate, all requests at once, bfloat16"),
            "core-fp32": _w1_row(400.0, "LLM.generate, all requests at once, float32"),
            "transformers": _w1_row(100.0, "generate, static batches of 8 (best: 8), fp32"),
            "llama.cpp": _w1_row(900.0, "llama-server, 32 slots: 64 requests"),
        },
        "load": {"core": {"dtype": "bfloat16"}, "core-fp32": {"dtype": "float32"}},
    }


def _row(table: str, engine: str) -> list[str]:
    line = next(line for line in table.split("\n") if line.startswith(f"| {engine} |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_each_w1_row_is_a_fraction_of_its_own_dtypes_batched_bound():
    results = _results()
    table = report.w1_section(results["W1"], _ceilings(), results["load"])
    assert _row(table, "core")[-1] == "50.0%"  # 1,750 / (700e9 / 2e8)
    assert _row(table, "core-fp32")[-1] == "80.0%"  # 400 / (100e9 / 2e8)
    assert _row(table, "transformers")[-1] == "20.0%"  # "fp32" in its how: 100 / 500
    assert _row(table, "llama.cpp")[-1] == "—"  # no dtype known: no bound claimed


def test_w3_row_takes_its_dtype_from_the_engines_load_entry():
    row = {"how": "core serve: 64 requests at max concurrency 16", "requests_per_s": 1.0,
           "output_tokens_per_s": 2.0, "ttft_median_ms": 1.0, "ttft_p99_ms": 1.0,
           "itl_median_ms": 1.0, "itl_p99_ms": 1.0, "total_tokens_per_s": 875.0}  # fmt: skip
    table = report.w3_section({"core": row}, _ceilings(), {"core": {"dtype": "bfloat16"}})
    assert _row(table, "core")[-1] == "25.0%"  # 875 / 3,500


def test_a_bfloat16_row_without_a_bfloat16_ceiling_claims_no_bound():
    c = Ceilings(2, 20.0, 100.0, MODEL)
    results = _results()
    table = report.w1_section(results["W1"], c, results["load"])
    assert _row(table, "core")[-1] == "—"
    assert report.flop_bound_targets(results, c, "core") == []


def test_flop_bound_target_uses_the_engines_dtype():
    by_name = {t.name: t for t in report.targets(_results(), _ceilings())}
    bf16 = by_name["core W1 total tok/s vs 60% of the bfloat16 FLOP bound"]
    assert bf16.ratio == pytest.approx(1750 / (0.6 * 3500)) and bf16.met is False
    fp32 = by_name["core-fp32 W1 total tok/s vs 60% of the float32 FLOP bound"]
    assert fp32.ratio == pytest.approx(400 / (0.6 * 500)) and fp32.met is True


def _table_rows(c: Ceilings) -> dict[str, str]:
    lines = report.ceilings_section(c).split("\n")[4:]
    return dict(tuple(cell.strip() for cell in line.strip("|").split("|")) for line in lines)


def test_ceilings_table_shows_a_missing_int8_gemm_as_a_dash():
    rows = _table_rows(_ceilings())
    assert rows["int8 GEMM (2048 x 2048)"] == "—"
    assert rows["batched bound, int8 (GEMM ops/s / (2 x params))"] == "—"
    assert rows["float32 GEMM (2048 x 2048)"] == "100 GFLOP/s"
    assert rows["batched bound, float32 (GEMM ops/s / (2 x params))"] == "500 tok/s"
    assert rows["batched bound, bfloat16 (GEMM ops/s / (2 x params))"] == "3,500 tok/s"


def test_ceilings_table_prints_a_measured_int8_gemm_and_a_probe_sized_one():
    c = Ceilings(2, 20.0, 100.0, MODEL, GemmCeiling(1.2, 512), GemmCeiling(1000.0, 2048))
    rows = _table_rows(c)
    assert rows["int8 GEMM (2048 x 2048)"] == "1,000 GOP/s"
    assert rows["batched bound, int8 (GEMM ops/s / (2 x params))"] == "5,000 tok/s"
    assert rows["bfloat16 GEMM (512 x 512: 2048 too slow on this CPU)"] == "1.2 GFLOP/s"
    assert rows["batched bound, bfloat16 (GEMM ops/s / (2 x params))"] == "6 tok/s"  # 1.2e9 / 2e8


def test_json_carries_every_ceiling_and_each_dtypes_batched_bound():
    data = json.loads(json.dumps(_ceilings().to_dict()))
    assert data["fp32_gemm_gflop_s"] == 100.0
    assert data["bf16_gemm"] == {"gop_s": 700.0, "size": 2048}
    assert data["int8_gemm"] is None
    assert data["batched_tokens_per_s"] == {"float32": 500.0, "bfloat16": 3500.0, "int8": None}


def _fake_gemm(gop_s: float, sizes: list[int]):
    def gemm_gop_s(dtype: torch.dtype, size: int, repeats: int) -> float:
        sizes.append(size)
        return gop_s

    return gemm_gop_s


# One 2048^3 call at 1 GOP/s: 2 x 2048^3 / 1e9 s.
FULL_CALL_S = 2 * 2048**3 / 1e9


@pytest.mark.parametrize(("budget_s", "size"), [(2 * FULL_CALL_S + 0.1, 2048),
                                                 (2 * FULL_CALL_S - 0.1, 512)])  # fmt: skip
def test_gemm_ceiling_times_2048_only_when_the_probe_says_it_fits(monkeypatch, budget_s, size):
    sizes: list[int] = []
    monkeypatch.setattr(ceilings, "gemm_gop_s", _fake_gemm(1.0, sizes))
    # repeats=1: a warm-up and one timed call of 2048^3 at the probe's 1 GOP/s.
    found = ceilings.gemm_ceiling(torch.bfloat16, repeats=1, budget_s=budget_s)
    assert found == GemmCeiling(1.0, size)
    assert sizes == [512, 2048][: 1 + (size == 2048)]


@pytest.mark.parametrize("break_it", ["raise", "remove"])
def test_gemm_ceiling_is_none_where_torch_runs_no_int8_gemm(monkeypatch, break_it):
    def no_kernel(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("_int_mm: no kernel for this CPU")

    if break_it == "raise":
        monkeypatch.setattr(torch, "_int_mm", no_kernel)
    else:
        monkeypatch.delattr(torch, "_int_mm")
    assert ceilings.gemm_ceiling(torch.int8) is None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.int8])
def test_gemm_ceiling_runs_real_gemms_of_each_dtype(monkeypatch, dtype):
    monkeypatch.setattr(ceilings, "PROBE_SIZE", 16)  # cheap: a budget of 0 stops at the probe
    found = ceilings.gemm_ceiling(dtype, repeats=1, budget_s=0.0)
    assert found is not None and found.size == 16 and found.gop_s > 0
