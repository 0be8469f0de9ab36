"""The report's async-scheduling targets: core-async (core-gguf with --async-scheduling)
against core-gguf, W1 at 1.05x and W2's decode at no loss."""

from __future__ import annotations

from benchmarks import report


def test_each_workload_is_judged_against_core_gguf():
    results = {
        "W1": {"core-gguf": {"total_tokens_per_s": 200.0},
               "core-async": {"total_tokens_per_s": 206.0}},
        "W2": {"core-gguf": {"decode_tokens_per_s": 40.0},
               "core-async": {"decode_tokens_per_s": 44.0}},
    }  # fmt: skip
    w1, w2 = report.async_targets(results)
    assert (round(w1.ratio, 3), w1.met) == (1.03, False)  # under 1.05
    assert (round(w2.ratio, 3), w2.met) == (1.1, True)
    assert "W1" in w1.name and "W2" in w2.name


def test_no_target_without_both_engines():
    assert report.async_targets({"W1": {"core-gguf": {"total_tokens_per_s": 1.0}}}) == []
