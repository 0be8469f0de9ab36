"""The linear kernels of batch-invariant mode, on every vector ISA this CPU runs: a row's
output is bit-identical computed alone and in batches of 2 to 64 at any position. The
quant_linear and fp8_linear GEMMs (what the same calls take without the mode) are not:
the comparison can fail."""

from __future__ import annotations

import pytest
import torch

_C = pytest.importorskip("core_cpu_kernels._C")

N, K = 200, 576  # N not a multiple of the 4-row blocks; K of SmolLM2's hidden size
ROWS = 64
BATCHES = ((0, 2), (1, 5), (3, 9), (7, 16), (0, 33), (20, 44), (0, 64))  # (first row, count)


def _rows_alone(linear, x: torch.Tensor) -> torch.Tensor:
    return torch.cat([linear(x[i : i + 1].clone()) for i in range(x.shape[0])])


def _batches_that_differ(linear, x: torch.Tensor) -> list[tuple[int, int]]:
    alone = _rows_alone(linear, x)
    return [
        (first, count)
        for first, count in BATCHES
        if not torch.equal(linear(x[first : first + count]), alone[first : first + count])
    ]


def _activations(dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(ROWS, K, generator=torch.Generator().manual_seed(0)).to(dtype)


def _quant_weight(bits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    if bits == 4:
        q = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, generator=g)
    else:
        q = torch.randint(-128, 128, (N, K), dtype=torch.int8, generator=g)
    groups = K // 32
    return q, torch.rand(N, groups, generator=g) * 0.02, -torch.rand(N, groups, generator=g) * 0.1


@pytest.mark.parametrize("isa", _C.quant_linear_isas())
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_quant_linear_rows_are_the_same_in_any_batch(isa, bits, dtype):
    q, scales, mins = _quant_weight(bits)

    def linear(x: torch.Tensor) -> torch.Tensor:
        return _C.quant_linear(x, q, scales, mins, bits, isa=isa, batch_invariant=True)

    assert _batches_that_differ(linear, _activations(dtype)) == []


@pytest.mark.parametrize("isa", _C.quant_linear_isas())
def test_without_the_mode_quant_linear_batches_round_otherwise(isa):
    q, scales, mins = _quant_weight(4)

    def linear(x: torch.Tensor) -> torch.Tensor:
        return _C.quant_linear(x, q, scales, mins, 4, isa=isa)

    assert _batches_that_differ(linear, _activations(torch.float32)) != []


def test_the_mode_refuses_int8_activations_and_strips():
    q, scales, mins = _quant_weight(4)
    x = _activations(torch.bfloat16)
    with pytest.raises(RuntimeError, match="batch_invariant takes the GEMV alone"):
        _C.quant_linear(x, q, scales, mins, 4, int8_x=True, batch_invariant=True)


def _fp8_weight() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    weight = torch.randn(N, K, generator=g).to(torch.float8_e4m3fn)
    return weight, torch.rand(N, -(-K // 128), generator=g)


@pytest.mark.parametrize("isa", _C.fp8_linear_isas())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_fp8_linear_rows_are_the_same_in_any_batch(isa, dtype):
    weight, scales = _fp8_weight()

    def linear(x: torch.Tensor) -> torch.Tensor:
        return _C.fp8_linear(x, weight, scales, 128, isa=isa, batch_invariant=True)

    assert _batches_that_differ(linear, _activations(dtype)) == []


@pytest.mark.parametrize("isa", _C.dense_linear_isas())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_dense_linear_rows_are_the_same_in_any_batch(isa, dtype):
    weight = torch.randn(N, K, generator=torch.Generator().manual_seed(3)).to(dtype)

    def linear(x: torch.Tensor) -> torch.Tensor:
        return _C.dense_linear(x, weight, None, isa=isa)

    assert _batches_that_differ(linear, _activations(dtype)) == []


@pytest.fixture
def invariant_mode():
    from core import batch_invariant

    batch_invariant.set_enabled(True)
    yield
    batch_invariant.set_enabled(False)


@pytest.mark.usefixtures("choices", "invariant_mode")
def test_in_the_mode_the_registered_op_answers_a_row_alike_in_any_batch():
    from core_cpu_kernels import ops

    q, scales, mins = _quant_weight(4)

    def linear(x: torch.Tensor) -> torch.Tensor:
        return ops.quant_linear(x, q, scales, mins, 4)

    assert _batches_that_differ(linear, _activations(torch.bfloat16)) == []


@pytest.mark.usefixtures("choices", "invariant_mode")
def test_in_the_mode_int8_activations_are_refused_naming_both(monkeypatch):
    from core_cpu_kernels import ops

    monkeypatch.setenv("CORE_CPU_INT8_ACTIVATIONS", "1")
    q, scales, mins = _quant_weight(4)
    with pytest.raises(ValueError, match="CORE_CPU_INT8_ACTIVATIONS.*--batch-invariant"):
        ops.quant_linear(_activations(torch.bfloat16), q, scales, mins, 4)


@pytest.mark.usefixtures("choices")
def test_core_cpu_isa_picks_the_linear_kernels_isa(monkeypatch):
    from core_cpu_kernels import ops

    monkeypatch.setenv("CORE_CPU_ISA", "no-such-isa")
    monkeypatch.setenv("CORE_KERNEL_CHOICE", "linear=gemv")  # unmeasured: torch's first
    q, scales, mins = _quant_weight(4)
    fp8, fp8_scales = _fp8_weight()
    x = _activations(torch.float32)[:2]
    calls = {
        "quant_linear": lambda: ops.quant_linear(x, q, scales, mins, 4),
        "dense_linear": lambda: ops.linear(x, torch.randn(N, K)),
        "fp8_linear": lambda: ops.fp8_linear(x, fp8, fp8_scales, 128),
    }
    for name, call in calls.items():
        with pytest.raises(RuntimeError, match=f"{name}: isa 'no-such-isa' is not available"):
            call()
