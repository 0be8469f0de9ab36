"""The step anatomy's shares and its report table: a row per engine and stream count, the
share outside the forward at each, and the overhead target judged at the widest batch."""

from __future__ import annotations

import pytest

from benchmarks import report, step_anatomy
from benchmarks.ceilings import Ceilings, ModelSize

CEILINGS = Ceilings(
    num_threads=2,
    read_bandwidth_gb_s=30.0,
    fp32_gemm_gflop_s=100.0,
    model=ModelSize(num_params=10**8, fp32_weight_bytes=4 * 10**8, file_weight_bytes=10**8),
)

PHASES = {"schedule_ms": 0.5, "inputs_ms": 1.0, "forward_ms": 14.0, "logits_ms": 3.0,
          "sample_ms": 0.5, "update_ms": 1.0, "step_ms": 20.0}  # fmt: skip


def test_shares_divide_the_engines_work_and_what_is_outside_the_forward_by_the_step():
    run = step_anatomy.shares(1, PHASES)
    assert run["streams"] == 1
    assert run["scheduling_and_inputs_share"] == pytest.approx(2.5 / 20)
    assert run["outside_forward_share"] == pytest.approx(6 / 20)
    assert run["forward_ms"] == 14.0


def _results() -> dict:
    narrow = step_anatomy.shares(1, PHASES)
    wide = step_anatomy.shares(32, {**PHASES, "schedule_ms": 4.0, "step_ms": 100.0})
    return {"W1": {"core-gguf": {"step_anatomy": {"runs": [narrow, wide]}}, "core": {}}}


def test_the_table_has_a_row_per_engine_and_stream_count_with_its_shares():
    table = report.step_anatomy_section(_results()["W1"])
    rows = [line for line in table.splitlines() if line.startswith("| core-gguf")]
    assert len(rows) == 2
    one, thirty_two = ([cell.strip() for cell in row.strip("|").split("|")] for row in rows)
    assert one[1] == "1" and one[-1] == "30.0%" and one[-2] == "12.5%"
    assert thirty_two[1] == "32" and thirty_two[-1] == "86.0%"
    assert "outside the forward" in table


def test_the_overhead_target_reads_the_widest_batch():
    targets = report.offline_targets(_results(), CEILINGS, "core-gguf")
    (overhead,) = [t for t in targets if "scheduling + input preparation" in t.name]
    assert "batch 32" in overhead.name
    assert overhead.detail == "6.0%" and overhead.met
