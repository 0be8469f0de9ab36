"""With the timings measured on an Intel Xeon with AMX (../shared/measurements/
intel-amx-2026-12-06.md) injected, core-cpu-kernels' candidates are chosen as that table
says: oneDNN on prepacked bf16 weights for batches, the packed 4-bit weight for few rows.

No session of ours has had an AMX machine: this is how the choice mechanism is shown to
pick the paths the table says are fastest. The table's columns map to candidates: aten::mm
on a plain weight -> `torch` (dense) / `dequantized` (4-bit), oneDNN prepacked -> `onednn`
/ `dequantized-onednn`, int4pack_mm (a GEMV on packed 4-bit weights) -> `packed`.
"""

from __future__ import annotations

import pytest
import torch
from core_cpu_kernels import candidates, packed_linear

from core.kernel_choice import ROW_BUCKETS, SWITCH_GAIN, KernelChoices, OpTiming, Problem

# (K, N) -> {M: (aten::mm, oneDNN prepacked, int4pack_mm)} in GFLOP/s, 2 threads.
AMX_GFLOPS = {
    (576, 960): {1: (22, 54, 73), 4: (67, 201, 162), 32: (627, 1213, 181),
                 128: (1495, 2558, 181), 512: (2364, 2793, 190)},
    (576, 3072): {1: (26, 62, 80), 32: (748, 887, 187), 128: (1329, 2182, 158),
                  2048: (3603, 3563, 183)},
    (1536, 576): {4: (111, 251, 140), 32: (816, 1594, 188), 512: (2327, 1696, 190)},
    (576, 49152): {32: (745, 1200, 181), 128: (1480, 2530, 184), 512: (1078, 1069, 171)},
}  # fmt: skip
DENSE = {"torch": 0, "onednn": 1}
QUANT = {"dequantized": 0, "dequantized-onednn": 1, "packed": 2}


def amx_seconds(columns: dict[str, int]):
    """A timer: 2 M N K FLOPs at the table's speed for the largest M it lists at or below
    the rows timed (its smallest M below them)."""

    def timer(candidate, problem: Problem, args: tuple) -> float:
        n, k = problem.shape
        rows = args[0].shape[0]
        table = AMX_GFLOPS[(k, n)]
        m = max([m for m in table if m <= rows] or [min(table)])
        return 2 * rows * n * k / (table[m][columns[candidate.name]] * 1e9)

    return timer


@pytest.fixture
def amx(monkeypatch, tmp_path):
    """This CPU as the Xeon: oneDNN takes bf16; no strips (the table has no figures)."""
    monkeypatch.setenv("CORE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("CORE_KERNEL_CHOICE", raising=False)
    monkeypatch.setattr(packed_linear, "takes", lambda dtype: True)
    monkeypatch.setattr(packed_linear, "available", lambda: True)
    monkeypatch.setattr(candidates, "strips_available", lambda: False)
    monkeypatch.setattr(candidates, "int8_activations", lambda: False)


def measured(op: str, weight_of, timer, shapes=tuple(AMX_GFLOPS)) -> KernelChoices:
    """Fresh choices with the real candidates of `op`, measured by `timer` on `shapes`."""
    choices = KernelChoices()
    choices.declare_op(op, OpTiming(candidates._with_rows))
    for candidate in _candidates(op):
        choices.register(candidate)
    with choices.recording() as recording:
        for k, n in shapes:
            args = weight_of(n, k)
            choices.kernel(_problem(op, args), 1, args)
        recorded = dict(recording)
    choices.measure(recorded, max_rows=8192, timer=timer)
    return choices


def _candidates(op: str) -> list:
    if op == "linear":
        return [candidates.TorchLinear(), candidates.Gemv(), candidates.OnednnLinear()]
    return [candidates.Packed(), candidates.Strips(), candidates.Dequantized(False),
            candidates.Dequantized(True)]  # fmt: skip


def _problem(op: str, args: tuple) -> Problem:
    if op == "linear":
        return candidates.linear_problem(args[1])
    return candidates.quant_linear_problem(args[0], args[1], 4)


def _dense(n: int, k: int) -> tuple:
    return (torch.zeros(1, k, dtype=torch.bfloat16), torch.zeros(n, k, dtype=torch.bfloat16), None)


def _q4(n: int, k: int) -> tuple:
    groups = k // 32
    return (torch.zeros(1, k, dtype=torch.bfloat16), torch.zeros(n, k // 2, dtype=torch.uint8),
            torch.zeros(n, groups), torch.zeros(n, groups), 4)  # fmt: skip


def _gemv_seconds(columns: dict[str, int]):
    """The GEMV has no column in the table: give it aten::mm's speed at 1 row (where torch
    multiplies a bf16 row with its matrix-vector product) and nothing better after."""
    timer = amx_seconds(columns)

    def with_gemv(candidate, problem, args):
        if candidate.name == "gemv":
            n, k = problem.shape
            table = AMX_GFLOPS[(k, n)]
            return 2 * args[0].shape[0] * n * k / (table[min(table)][0] * 1e9)
        return timer(candidate, problem, args)

    return with_gemv


def expected_winners(columns: dict[str, int]):
    """Per (shape, M <= 512) of the table: the candidates within SWITCH_GAIN of its fastest
    column (a near tie may keep the smaller bucket's kernel)."""
    for (k, n), table in AMX_GFLOPS.items():
        for m, speeds in table.items():
            if m > 512:  # past the last bucket's start: timed at 512 rows
                continue
            best = max(speeds[i] for i in columns.values())
            near = {name for name, i in columns.items() if speeds[i] * SWITCH_GAIN >= best}
            yield (n, k), m, near


def test_bf16_dense_layers_batch_on_prepacked_onednn_as_measured_on_amx(amx):
    choices = measured("linear", _dense, _gemv_seconds(DENSE))
    for (n, k), m, near in expected_winners(DENSE):
        problem = Problem("linear", "bfloat16", (n, k))
        assert choices.kernel(problem, m, ()).name in near, (n, k, m)
    # Clear wins of the table: prepacked at decode batch sizes.
    assert choices.kernel(Problem("linear", "bfloat16", (960, 576)), 32, ()).name == "onednn"
    assert choices.kernel(Problem("linear", "bfloat16", (576, 1536)), 32, ()).name == "onednn"


def test_4bit_weights_stay_packed_for_few_rows_and_batch_on_a_dequantized_copy(amx):
    choices = measured("quant_linear", _q4, amx_seconds(QUANT))
    for (n, k), m, near in expected_winners(QUANT):
        problem = Problem("quant_linear", "q4/bfloat16", (n, k))
        assert choices.kernel(problem, m, ()).name in near, (n, k, m)
    qkv = Problem("quant_linear", "q4/bfloat16", (960, 576))
    assert choices.kernel(qkv, 1, ()).name == "packed"  # 73 vs 54 GFLOP/s
    assert choices.kernel(qkv, 128, ()).name == "dequantized-onednn"  # 2,558 vs 181
    assert choices.kernel(qkv, 4096, ()).name == "dequantized-onednn"


def test_without_onednn_bf16_the_cpu_never_times_or_chooses_it(amx, monkeypatch):
    monkeypatch.setattr(packed_linear, "takes", lambda dtype: dtype is torch.float32)
    timed: set[str] = set()
    timer = _gemv_seconds(DENSE)

    def spy(candidate, problem, args):
        timed.add(candidate.name)
        return timer(candidate, problem, args)

    choices = measured("linear", _dense, spy, shapes=[(576, 960)])
    assert timed == {"torch", "gemv"}
    problem = Problem("linear", "bfloat16", (960, 576))
    assert all(choices.kernel(problem, rows, ()).name != "onednn" for rows in ROW_BUCKETS)
