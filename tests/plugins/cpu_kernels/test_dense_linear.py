"""The C++ core::linear GEMV against a float64 product, per vector ISA, and which inputs
the registered kernel hands to it when the GEMV is its chosen candidate."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from core.ops import linear_reference
from core.ops.linear import TOLERANCES as LINEAR_TOLERANCES

ops = pytest.importorskip(
    "core_cpu_kernels.ops", reason="core-cpu-kernels is not installed (optional plugin)"
)
from core_cpu_kernels import _C  # noqa: E402

ISAS = _C.dense_linear_isas()
# (N, K): a row past the 4-row blocks and K past a vector (tails of both); K smaller than
# one vector; SmolLM2's QKV, down projection and a slice of its vocabulary.
SHAPES = [(1, 1), (7, 13), (5, 40), (960, 576), (576, 1536), (4099, 576)]
ROWS = [1, 2, 3, 4, 5, 9]  # every token pass: 1, 2, 3, 4 tokens and their mixes


def _tensor(shape, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen).to(dtype)


def _exact(x, weight, bias):
    """The product in float64 from the (already rounded) inputs."""
    out = x.double() @ weight.double().T
    return out if bias is None else out + bias.double()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("rows", ROWS)
def test_float32_matches_the_float64_product(isa, n, k, rows):
    x, weight = _tensor((rows, k), torch.float32, 0), _tensor((n, k), torch.float32, 1)
    bias = _tensor(n, torch.float32, 2) if n % 2 else None
    got = _C.dense_linear(x, weight, bias, isa)
    want = _exact(x, weight, bias)
    # float32 sums of k products: the error grows with the magnitudes summed.
    scale = (x.double().abs() @ weight.double().abs().T) + 1
    assert got.dtype == torch.float32 and got.shape == (rows, n)
    assert ((got.double() - want).abs() <= 1e-5 * scale).all()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n,k", SHAPES)
def test_16_bit_weights_round_the_float32_product_once(isa, dtype, n, k):
    x, weight = _tensor((3, k), dtype, 0), _tensor((n, k), dtype, 1)
    bias = _tensor(n, dtype, 2)
    got = _C.dense_linear(x, weight, bias, isa)
    want = _exact(x, weight, bias)
    assert got.dtype == dtype
    # One rounding of a float32 sum: within half an ulp of the 16-bit result, plus the
    # float32 sum's own error.
    ulp = 2.0**-8 if dtype is torch.bfloat16 else 2.0**-11
    scale = (x.double().abs() @ weight.double().abs().T) + bias.double().abs()
    tolerance = ulp * want.abs() + 1e-5 * scale + 1e-30
    assert ((got.double() - want).abs() <= tolerance).all()


def test_every_isa_gives_the_same_float32_sums_up_to_their_order():
    x, weight = _tensor((4, 576), torch.float32, 0), _tensor((64, 576), torch.float32, 1)
    outs = [_C.dense_linear(x, weight, None, isa) for isa in ISAS]
    # Each sum lies within 1e-5 of the magnitudes summed of the exact one (above), so two
    # ISAs' within twice that: a fixed tolerance fails on sums that cancel (seen: 1.1e-5
    # apart on a sum of 0.04, AVX-512 vs AVX2).
    scale = x.double().abs() @ weight.double().abs().T
    for out in outs[1:]:
        assert ((out.double() - outs[0].double()).abs() <= 2e-5 * scale).all()


def test_an_unknown_isa_is_refused():
    x, weight = torch.ones(1, 4), torch.ones(2, 4)
    with pytest.raises(RuntimeError, match="isa 'sse9'"):
        _C.dense_linear(x, weight, None, "sse9")


def test_mismatched_dtypes_are_refused_by_the_kernel():
    with pytest.raises(RuntimeError, match="one dtype"):
        _C.dense_linear(torch.ones(1, 4), torch.ones(2, 4, dtype=torch.bfloat16))


# ---- the registered kernel: what goes to the GEMV, what to the reference ----------------


@pytest.fixture(autouse=True)
def _own_choices(choices):
    """Every test here gets its own kernel choices (conftest.py)."""


def _gemv_calls(monkeypatch):
    calls = []
    real = _C.dense_linear

    def spy(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(ops._C, "dense_linear", spy)
    return calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows", [1, 6, 600])  # 3-D: [2, rows / 2, K], 1: [1, 1, K]
def test_a_forced_gemv_takes_any_rows_as_one_matrix_and_matches_torch(dtype, rows, monkeypatch):
    monkeypatch.setenv("CORE_KERNEL_CHOICE", "linear=gemv")
    calls = _gemv_calls(monkeypatch)
    shape = (1, 1, 40) if rows == 1 else (2, rows // 2, 40)
    x, weight = _tensor(shape, dtype, 0), _tensor((9, 40), dtype, 1)
    got = ops.linear(x, weight, None)
    assert calls == [torch.Size([rows, 40])]
    assert got.shape == (*shape[:-1], 9)
    tolerance = LINEAR_TOLERANCES[dtype]
    want = F.linear(x.float(), weight.float()).to(dtype)  # one rounding of the float32 sum
    torch.testing.assert_close(got, want, rtol=tolerance.rtol, atol=tolerance.atol)


def test_an_unmeasured_layer_gets_the_reference_exactly(monkeypatch):
    # Until the worker measures, the first registered candidate serves: torch's BLAS.
    calls = _gemv_calls(monkeypatch)
    x, weight = _tensor((5, 40), torch.float32, 0), _tensor((9, 40), torch.float32, 1)
    assert torch.equal(ops.linear(x, weight, None), linear_reference(x, weight, None))
    assert calls == []


@pytest.mark.parametrize(
    "case",
    ["dtype_mismatch", "transposed_weight", "bias_of_other_dtype", "no_rows"],
)
def test_inputs_the_gemv_does_not_take_get_the_reference_exactly(case, monkeypatch):
    monkeypatch.setenv("CORE_KERNEL_CHOICE", "linear=gemv")
    calls = _gemv_calls(monkeypatch)
    x, weight = _tensor((2, 16), torch.float32, 0), _tensor((8, 16), torch.float32, 1)
    bias = None
    if case == "dtype_mismatch":
        x = x.double()
        weight = weight.double()
    elif case == "transposed_weight":
        weight = _tensor((16, 8), torch.float32, 1).t()
    elif case == "bias_of_other_dtype":
        bias = torch.ones(8, dtype=torch.float64)
        x, weight = x.double(), weight.double()
    else:
        x = x[:0]
    assert torch.equal(ops.linear(x, weight, bias), linear_reference(x, weight, bias))
    assert calls == []


def test_a_strided_activation_is_copied_for_the_gemv(monkeypatch):
    monkeypatch.setenv("CORE_KERNEL_CHOICE", "linear=gemv")
    calls = _gemv_calls(monkeypatch)
    x = _tensor((40, 2), torch.float32, 0).t()  # [2, 40], rows strided
    weight = _tensor((9, 40), torch.float32, 1)
    torch.testing.assert_close(ops.linear(x, weight), F.linear(x, weight), rtol=1e-5, atol=1e-5)
    assert calls == [torch.Size([2, 40])]


def test_the_registered_kernel_serves_core_linear_on_the_cpu():
    ops.register()
    from core.ops import provider

    assert provider("linear", "cpu") == ops.PROVIDER
