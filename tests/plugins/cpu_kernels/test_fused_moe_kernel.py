"""The C++ core::fused_moe kernel (`_C.fused_moe`) against core's reference, and the op
running the kernel the choice names (candidates.py: "reference", "grouped").

The kernel sums in float32 and rounds once where the reference rounds each expert's
output in the hidden dtype, so they agree to the op's own tolerances
(core/ops/fused_moe.py `TOLERANCES`). Hidden size 40 and intermediate size 24 are no
multiple of the GEMVs' 16-wide vectors; routing with replacement gives a token the same
expert in two slots.
"""

from __future__ import annotations

import pytest
import torch

from core.kernel_choice import Problem
from core.ops import fused_moe_reference
from core.ops.fused_moe import TOLERANCES, _fused_moe_samples
from core.ops.samples import randn

ops = pytest.importorskip(
    "core_cpu_kernels.ops", reason="core-cpu-kernels is not installed (optional plugin)"
)
from core_cpu_kernels import _C  # noqa: E402

CPU = torch.device("cpu")
DTYPES = [torch.float32, torch.bfloat16]
SIZE, INTER = 40, 24


def _weights(experts: int, dtype: torch.dtype, seed: int = 1) -> tuple[torch.Tensor, ...]:
    """w13 [E, 2 * INTER, SIZE] and w2 [E, SIZE, INTER], scaled to keep outputs near 1."""
    w13 = randn((experts, 2 * INTER, SIZE), dtype, CPU, seed, scale=SIZE**-0.5)
    w2 = randn((experts, SIZE, INTER), dtype, CPU, seed + 1, scale=INTER**-0.5)
    return w13, w2


def _args(tokens: int, experts: int, top_k: int, dtype: torch.dtype, ids=None) -> tuple:
    """hidden, w13, w2, softmax routing weights and ids drawn with replacement (or `ids`)."""
    gen = torch.Generator().manual_seed(3)
    if ids is None:
        ids = torch.randint(0, experts, (tokens, top_k), generator=gen)
    weights = torch.rand(tokens, top_k, generator=gen).softmax(dim=1)
    return (randn((tokens, SIZE), dtype, CPU, seed=0), *_weights(experts, dtype), weights, ids)


def _assert_equals_reference(got: torch.Tensor, args: tuple) -> None:
    want = fused_moe_reference(*args)
    assert (got.dtype, got.shape) == (want.dtype, want.shape)
    tolerance = TOLERANCES[want.dtype]
    torch.testing.assert_close(got, want, rtol=tolerance.rtol, atol=tolerance.atol)


# ---- the C++ kernel against the reference ---------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_kernel_equals_the_reference_on_every_conformance_sample(dtype):
    for sample in _fused_moe_samples(dtype, CPU):
        _assert_equals_reference(_C.fused_moe(*sample.args), sample.args)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("experts", [4, 8, 16])
@pytest.mark.parametrize("top_k", [1, 2, 8])
def test_the_kernel_equals_the_reference_at_every_expert_count_and_top_k(dtype, experts, top_k):
    args = _args(13, experts, top_k, dtype)
    _assert_equals_reference(_C.fused_moe(*args), args)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_tokens_routed_to_no_expert_get_zero_rows(dtype):
    ids = torch.tensor([[0, 3], [-1, -1], [4, 100], [2, -1], [-5, 4]])  # E = 4
    args = _args(5, 4, 2, dtype, ids=ids)
    got = _C.fused_moe(*args)
    assert torch.equal(got[[1, 2, 4]], torch.zeros(3, SIZE, dtype=dtype))
    _assert_equals_reference(got, args)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_one_expert_taking_every_token_in_every_slot(dtype):
    args = _args(33, 6, 2, dtype, ids=torch.full((33, 2), 5))
    _assert_equals_reference(_C.fused_moe(*args), args)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_int32_ids_give_what_int64_ids_give(dtype):
    args = _args(9, 8, 2, dtype)
    int32 = (*args[:4], args[4].to(torch.int32))
    assert torch.equal(_C.fused_moe(*int32), _C.fused_moe(*args))


def test_the_result_does_not_depend_on_the_thread_count():
    # Large enough (64 tokens x top-8 of 4) that each projection splits among threads.
    args = _args(64, 4, 8, torch.float32)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = _C.fused_moe(*args)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(_C.fused_moe(*args), alone)


def test_no_tokens_give_no_rows():
    args = _args(0, 4, 2, torch.float32)
    assert _C.fused_moe(*args).shape == (0, SIZE)


def _misshaped(name: str) -> tuple:
    hidden, w13, w2, weights, ids = _args(3, 4, 2, torch.float32)
    return {
        "hidden": (hidden[None], w13, w2, weights, ids),
        "w13": (hidden, w13[:, :, :-1], w2, weights, ids),
        "w2": (hidden, w13, w2[:, :, :-1], weights, ids),
        "topk_ids": (hidden, w13, w2, weights, ids[:-1]),
        "topk_weights": (hidden, w13, w2, weights[:, :1], ids),
    }[name]


@pytest.mark.parametrize("name", ["hidden", "w13", "w2", "topk_ids", "topk_weights"])
def test_a_wrong_shape_raises_naming_the_argument(name):
    with pytest.raises(RuntimeError, match=f"^{name} of fused_moe must be"):
        _C.fused_moe(*_misshaped(name))


def test_weights_of_another_dtype_are_refused_naming_them():
    hidden, w13, w2, weights, ids = _args(3, 4, 2, torch.float32)
    with pytest.raises(RuntimeError, match="w2 of fused_moe must be contiguous and of hidden"):
        _C.fused_moe(hidden, w13, w2.to(torch.bfloat16), weights, ids)


# ---- the op and its kernel choice -------------------------------------------------------------


@pytest.fixture(autouse=True)
def _own_choices(choices):
    """Every test here gets its own kernel choices (conftest.py)."""


def test_both_candidates_take_a_fused_moe_problem(choices):
    found = choices.candidates["fused_moe"]
    assert [c.name for c in found] == ["reference", "grouped"]  # the reference serves first
    for dtype in ("float32", "bfloat16"):
        problem = Problem("fused_moe", dtype, (8, INTER, SIZE, 2))
        assert all(c.available() and c.takes(problem) for c in found)


def _spy_on_kernel(monkeypatch) -> list[int]:
    """The token count of each call of `_C.fused_moe` (which still runs)."""
    calls, real = [], _C.fused_moe

    def spy(*args):
        calls.append(args[0].shape[0])
        return real(*args)

    monkeypatch.setattr(_C, "fused_moe", spy)
    return calls


def test_a_forced_grouped_choice_runs_the_cpp_kernel(monkeypatch):
    monkeypatch.setenv("CORE_KERNEL_CHOICE", "fused_moe=grouped")
    calls = _spy_on_kernel(monkeypatch)
    args = _args(7, 8, 2, torch.bfloat16)
    _assert_equals_reference(ops.fused_moe(*args), args)
    assert calls == [7]


def test_before_any_measurement_the_reference_serves(monkeypatch):
    calls = _spy_on_kernel(monkeypatch)
    args = _args(7, 8, 2, torch.float32)
    assert torch.equal(ops.fused_moe(*args), fused_moe_reference(*args))
    assert calls == []


def test_the_op_runs_the_candidate_measured_fastest_at_its_token_count(
    choices, monkeypatch, tmp_path
):
    monkeypatch.setenv("CORE_CACHE_DIR", str(tmp_path))

    def timer(candidate, problem, args) -> float:  # figures, not timings
        fastest = "grouped" if args[0].shape[0] < 16 else "reference"
        return 1e-6 if candidate.name == fastest else 1e-5

    args = _args(1, 8, 2, torch.float32)
    with choices.recording() as recording:
        ops.fused_moe(*args)
        recorded = dict(recording)
    choices.measure(recorded, max_rows=64, timer=timer)
    calls = _spy_on_kernel(monkeypatch)
    for tokens in (3, 15, 16, 40):
        args = _args(tokens, 8, 2, torch.float32)
        _assert_equals_reference(ops.fused_moe(*args), args)
    assert calls == [3, 15]


def test_strided_weights_take_the_reference(monkeypatch):
    monkeypatch.setenv("CORE_KERNEL_CHOICE", "fused_moe=grouped")
    calls = _spy_on_kernel(monkeypatch)
    hidden, w13, w2, weights, ids = _args(5, 4, 2, torch.float32)
    args = (hidden, w13, w2.transpose(1, 2).contiguous().transpose(1, 2), weights, ids)
    assert torch.equal(ops.fused_moe(*args), fused_moe_reference(*args))
    assert calls == []
