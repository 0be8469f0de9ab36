"""The kernels core-cpu-kernels offers core.kernel_choice (candidates.py) against the ops'
references, and the ops running the kernel the choice names.

Every registered candidate of core::linear and core::quant_linear that runs here and takes
the problem equals `linear_reference` / `quant_linear_reference` to the op's own
conformance tolerances (core/ops/linear.py and core/ops/quant_linear.py `TOLERANCES`):
float32 to 1e-5 relative (plus 1e-4 absolute for sums that cancel); a 16-bit linear within
two units of its dtype's precision (the reference rounds torch's float32 sum once, as the
GEMV and oneDNN do, but from another summation order); a quantized one within one unit, and
for bfloat16 x within 0.4 absolute (W may be rounded to bfloat16). The row counts reach
both sides of the kernels' register blocks and of the choice's row buckets; N = 70 is no
multiple of 16 or 64 (the vector and strip widths); K = 96 is three quant groups of 32.
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch

from core.kernel_choice import KernelCandidate, KernelChoices, Problem
from core.ops import linear_reference, quant_linear_reference
from core.ops.linear import TOLERANCES as LINEAR_TOLERANCES
from core.ops.quant_linear import TOLERANCES as QUANT_TOLERANCES
from core.ops.quant_linear import pack
from core.ops.samples import randn

ops = pytest.importorskip(
    "core_cpu_kernels.ops", reason="core-cpu-kernels is not installed (optional plugin)"
)
from core_cpu_kernels import candidates, packed_linear, weight_copies  # noqa: E402

CPU = torch.device("cpu")
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
ROWS = [1, 2, 3, 17, 64, 129, 600]
N, K, GROUP = 70, 96, 32


def _registered(op: str) -> list[KernelCandidate]:
    """The candidates `candidates.register` adds for `op` (into choices of their own)."""
    choices = KernelChoices()
    with mock.patch.object(candidates, "KERNEL_CHOICES", choices):
        candidates.register()
    return choices.candidates[op]


def _keeps_copy(candidate: KernelCandidate) -> bool:
    """Whether `candidate` keeps a copy of a weight (of a float32 problem) beside it."""
    problem_format = "float32" if candidate.op == "linear" else "q4/float32"
    return candidate.copy_bytes(Problem(candidate.op, problem_format, (N, K))) > 0


LINEAR = [pytest.param(c, id=c.name) for c in _registered("linear")]
QUANT = [pytest.param(c, id=c.name) for c in _registered("quant_linear")]
COPYING = [p for p in [*LINEAR, *QUANT] if _keeps_copy(p.values[0])]


@pytest.fixture(autouse=True)
def _own_choices(choices):
    """Every test here gets its own kernel choices (conftest.py)."""


def _linear_args(rows: int, dtype: torch.dtype, bias: bool = True) -> tuple:
    """x [rows, K], weight [N, K], bias [N] | None: fresh tensors (not inference ones, so
    the candidates may keep copies of the weight)."""
    x = randn((rows, K), dtype, CPU, seed=0)
    weight = randn((N, K), dtype, CPU, seed=1, scale=0.5)
    return x, weight, randn((N,), dtype, CPU, seed=2) if bias else None


def _quant_args(rows: int, dtype: torch.dtype, bits: int) -> tuple:
    """x [rows, K] and a packed weight [N, K] in groups of 32 with AWQ-like scales and zero
    points (mins = -zero * scale), as core.ops.quant_linear's samples build them."""
    gen = torch.Generator().manual_seed(1)
    low, high = (0, 16) if bits == 4 else (-128, 128)
    q = torch.randint(low, high, (N, K), generator=gen)
    scales = torch.rand(N, K // GROUP, generator=gen) * 0.02 + 1e-3
    zeros = torch.randint(0, 16, (N, K // GROUP), generator=gen).float()
    return randn((rows, K), dtype, CPU, seed=0), pack(q, bits), scales, -zeros * scales, bits


def _problem(candidate: KernelCandidate, args: tuple) -> Problem:
    if candidate.op == "linear":
        return candidates.linear_problem(args[1])
    return candidates.quant_linear_problem(args[0], args[1], args[4])


def _skip_unless_it_runs(candidate: KernelCandidate, args: tuple) -> None:
    """Skip (before calling it) a candidate the choice would never call on `args`."""
    if not candidate.available():
        pytest.skip(f"{candidate.name} cannot run on this machine")
    problem = _problem(candidate, args)
    if not candidate.takes(problem):
        pytest.skip(f"{candidate.name} does not take {problem.label()} here")


def _assert_equals_reference(op: str, got: torch.Tensor, args: tuple) -> None:
    if op == "linear":
        want, tolerance = linear_reference(*args), LINEAR_TOLERANCES[args[0].dtype]
    else:
        want, tolerance = quant_linear_reference(*args), QUANT_TOLERANCES[args[0].dtype]
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=tolerance.rtol, atol=tolerance.atol)


# ---- every candidate against the reference ------------------------------------------------


@pytest.mark.parametrize("candidate", LINEAR)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("bias", [False, True], ids=["", "bias"])
def test_every_linear_candidate_equals_the_reference(candidate, dtype, rows, bias):
    args = _linear_args(rows, dtype, bias)
    _skip_unless_it_runs(candidate, args)
    _assert_equals_reference_through_its_copy(candidate, args)


@pytest.mark.parametrize("candidate", QUANT)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("bits", [4, 8])
def test_every_quant_linear_candidate_equals_the_reference(candidate, dtype, rows, bits):
    args = _quant_args(rows, dtype, bits)
    _skip_unless_it_runs(candidate, args)
    _assert_equals_reference_through_its_copy(candidate, args)


def _assert_equals_reference_through_its_copy(candidate: KernelCandidate, args: tuple) -> None:
    """The candidate's result equals the reference, and one that keeps a copy of the weight
    made it (so the copy was multiplied, not the weight by the fallback)."""
    before = weight_copies.copied_bytes()
    got = candidate(*args)
    _assert_equals_reference(candidate.op, got, args)
    keeps_copy = candidate.copy_bytes(_problem(candidate, args)) > 0
    assert (weight_copies.copied_bytes() > before) == keeps_copy


def _first_taken_dtype(candidate: KernelCandidate, make) -> torch.dtype:
    """The first of float32, bfloat16 that `candidate` takes (skip if neither)."""
    for dtype in (torch.float32, torch.bfloat16):
        if candidate.takes(_problem(candidate, make(dtype))):
            return dtype
    pytest.skip(f"{candidate.name} takes neither float32 nor bfloat16 here")


def _maker(candidate: KernelCandidate, rows: int):
    if candidate.op == "linear":
        return lambda dtype: _linear_args(rows, dtype)
    return lambda dtype: _quant_args(rows, dtype, 4)


@pytest.mark.parametrize("candidate", COPYING)
def test_a_candidate_refused_its_weight_copy_still_equals_the_reference(candidate, monkeypatch):
    if not candidate.available():
        pytest.skip(f"{candidate.name} cannot run on this machine")
    make = _maker(candidate, 17)
    args = make(_first_taken_dtype(candidate, make))
    monkeypatch.setattr(weight_copies, "max_bytes", lambda: 0)
    before = weight_copies.copied_bytes()
    got = candidate(*args)
    assert weight_copies.copied_bytes() == before
    _assert_equals_reference(candidate.op, got, args)


# ---- the ops run the candidate the choice names ---------------------------------------------


def _calls(monkeypatch, *classes) -> list[tuple[str, int]]:
    """(candidate name, rows) of each call of a candidate of `classes`, which still run."""
    calls = []
    for cls in classes:

        def spy(self, *args, _real=cls.__call__):
            calls.append((self.name, args[0].shape[0]))
            return _real(self, *args)

        monkeypatch.setattr(cls, "__call__", spy)
    return calls


def _run_op(args: tuple) -> torch.Tensor:
    return ops.linear(*args) if len(args) == 3 else ops.quant_linear(*args)


@pytest.mark.parametrize("candidate", [*LINEAR, *QUANT])
@pytest.mark.parametrize("rows", [1, 129])
def test_the_op_runs_the_forced_candidate(candidate, rows, monkeypatch):
    if not candidate.available():
        pytest.skip(f"{candidate.name} cannot run on this machine")
    make = _maker(candidate, rows)
    args = make(_first_taken_dtype(candidate, make))
    monkeypatch.setenv("CORE_KERNEL_CHOICE", f"{candidate.op}={candidate.name}")
    calls = _calls(monkeypatch, type(candidate))
    got = _run_op(args)
    assert calls == [(candidate.name, rows)]
    _assert_equals_reference(candidate.op, got, args)


def test_ops_linear_runs_the_candidate_measured_fastest_at_its_row_count(
    choices, monkeypatch, tmp_path
):
    monkeypatch.setenv("CORE_CACHE_DIR", str(tmp_path))

    def timer(candidate, problem, args) -> float:  # figures, not timings
        fastest = "gemv" if args[0].shape[0] < 16 else "torch"
        return 1e-6 if candidate.name == fastest else 1e-5

    x, weight, bias = _linear_args(1, torch.float32)
    with choices.recording() as recording:
        ops.linear(x, weight, bias)
        recorded = dict(recording)
    choices.measure(recorded, max_rows=1024, timer=timer)
    calls = _calls(monkeypatch, candidates.Gemv, candidates.TorchLinear, candidates.OnednnLinear)
    for rows in (3, 15, 16, 600):
        args = (randn((rows, K), torch.float32, CPU, seed=0), weight, bias)
        _assert_equals_reference("linear", ops.linear(*args), args)
    assert calls == [("gemv", 3), ("gemv", 15), ("torch", 16), ("torch", 600)]


def test_a_forced_kernel_that_does_not_take_the_problem_is_never_called(monkeypatch):
    # A CPU without oneDNN bf16 (this AVX2 EPYC's case): onednn does not take bf16 weights.
    monkeypatch.setattr(packed_linear, "available", lambda: True)
    monkeypatch.setattr(packed_linear, "takes", lambda dtype: dtype is torch.float32)
    monkeypatch.setenv("CORE_KERNEL_CHOICE", "linear=onednn")
    calls = _calls(monkeypatch, candidates.OnednnLinear, candidates.TorchLinear)
    args = _linear_args(3, torch.bfloat16)
    got = ops.linear(*args)
    assert calls == [("torch", 3)]  # the first registered candidate that takes it
    assert torch.equal(got, linear_reference(*args))


def test_an_unavailable_candidate_is_never_timed_nor_may_it_be_forced(
    choices, monkeypatch, tmp_path
):
    monkeypatch.setenv("CORE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(packed_linear, "available", lambda: False)
    args = _linear_args(1, torch.float32)
    monkeypatch.setenv("CORE_KERNEL_CHOICE", "linear=onednn")
    with pytest.raises(ValueError, match="onednn cannot run on this machine"):
        ops.linear(*args)
    monkeypatch.delenv("CORE_KERNEL_CHOICE")
    timed: set[str] = set()

    def timer(candidate, problem, args) -> float:
        timed.add(candidate.name)
        return 1e-5

    with choices.recording() as recording:
        ops.linear(*args)
        recorded = dict(recording)
    choices.measure(recorded, max_rows=64, timer=timer)
    assert timed == {"torch", "gemv"}


def test_register_offers_every_kernel_of_both_linear_ops(choices):
    # The first of each op serves until measured: the reference's way, the packed weight.
    assert [c.name for c in choices.candidates["linear"]] == ["torch", "gemv", "onednn"]
    assert [c.name for c in choices.candidates["quant_linear"]] == [
        "packed",
        "strips",
        "interleaved",
        "dequantized",
        "dequantized-onednn",
    ]


def test_one_weight_multiplies_activations_of_two_dtypes_through_its_dequantized_copy():
    kernel = candidates.Dequantized(onednn=False)
    _, qweight, scales, mins, bits = _quant_args(1, torch.float32, 4)
    for dtype in (torch.float32, torch.bfloat16):
        args = (randn((3, K), dtype, CPU, seed=0), qweight, scales, mins, bits)
        _assert_equals_reference("quant_linear", kernel(*args), args)
