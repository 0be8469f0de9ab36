"""core-invariant, core-gguf with --batch-invariant: how the benchmark runs it, and the
report's targets on what the mode costs against core-gguf, at most 15% of W1's total
tok/s and 5% of W2's decode tok/s."""

from __future__ import annotations

import argparse

from benchmarks import __main__ as bench
from benchmarks import report
from benchmarks.ceilings import Ceilings, ModelSize


def _results(w1: float, w2: float) -> report.Results:
    """core-gguf at 200 total tok/s on W1 and 40 decode tok/s on W2 (25 ms a token), and
    core-invariant at `w1` and `w2`."""
    return {
        "W1": {"core-gguf": {"total_tokens_per_s": 200.0},
               "core-invariant": {"total_tokens_per_s": w1}},
        "W2": {"core-gguf": {"decode_tokens_per_s": 40.0, "tpot_ms": 25.0},
               "core-invariant": {"decode_tokens_per_s": w2, "tpot_ms": 1000 / w2}},
    }  # fmt: skip


def test_each_workload_prints_the_ratio_and_the_cost_against_its_goal():
    w1, w2 = report.invariant_targets(_results(w1=160.0, w2=38.8))
    assert (w1.ratio, w1.goal, w1.met) == (0.8, ">= 0.85 (cost <= 15%)", False)
    assert w1.detail == "160 / 200: costs 20.0%"
    assert (round(w2.ratio, 3), w2.goal, w2.met) == (0.97, ">= 0.95 (cost <= 5%)", True)
    assert w2.detail == "38.8 / 40.0: costs 3.0% (TPOT 25.8 / 25.0 ms)"
    assert "W1" in w1.name and "W2" in w2.name and "--batch-invariant" in w1.name


def test_a_cost_of_exactly_the_goal_is_met():
    w1, w2 = report.invariant_targets(_results(w1=170.0, w2=38.0))
    assert w1.met and w2.met
    w1, w2 = report.invariant_targets(_results(w1=169.0, w2=37.9))
    assert not w1.met and not w2.met


def test_no_target_without_both_engines():
    results = _results(w1=160.0, w2=39.0)
    del results["W1"]["core-gguf"], results["W2"]["core-invariant"]
    assert report.invariant_targets(results) == []


def test_the_targets_table_has_the_rows():
    ceilings = Ceilings(2, 20.0, 100.0, ModelSize(100_000_000, 400_000_000, 80_000_000))
    table = report.targets_section(report.targets(_results(w1=160.0, w2=38.8), ceilings))
    assert (
        "| core W1 total_tokens_per_s, --batch-invariant vs without "
        "| 160 / 200: costs 20.0% | 0.80 | >= 0.85 (cost <= 15%) | **no** |"
    ) in table
    w2_row = "| 38.8 / 40.0: costs 3.0% (TPOT 25.8 / 25.0 ms) | 0.97 | >= 0.95 (cost <= 5%) | yes |"
    assert w2_row in table


def test_core_invariant_is_core_gguf_with_the_mode_on_w1_and_w2_in_a_child(
    monkeypatch, children_in_process
):
    calls = []
    monkeypatch.setattr(bench, "core_offline_in_child", lambda *a, **kw: calls.append((a, kw)))
    inputs = bench.Inputs("model.gguf", None, "w1 prompts", "w2 prompts")
    args = argparse.Namespace(workloads=("W1", "W2", "W3"), threads=2)
    bench.RUNNERS["core-invariant"](args, "sizes", inputs)
    assert calls == [((2, "core-invariant", ["W1", "W2"], "sizes", "w1 prompts", "model.gguf"),
                      {"environment": {}, "quantization": "gguf",
                       "batch_invariant": True})]  # fmt: skip
    assert "core-invariant" in bench.parse_args(["--peers", "core-gguf,core-invariant"]).peers
