"""The C++ core::linear GEMV against a float64 product, per vector ISA, and which inputs
the registered kernel hands to it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from core.ops import linear_reference

ops = pytest.importorskip(
    "core_cpu_kernels.ops", reason="core-cpu-kernels is not installed (optional plugin)"
)
from core_cpu_kernels import _C, packed_linear  # noqa: E402

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


def _gemv_calls(monkeypatch):
    calls = []
    real = _C.dense_linear

    def spy(*args):
        calls.append(args[0].shape)
        return real(*args)

    monkeypatch.setattr(ops._C, "dense_linear", spy)
    return calls


def test_few_float32_rows_take_the_gemv_and_match_torch(monkeypatch):
    calls = _gemv_calls(monkeypatch)
    x, weight = _tensor((2, 3, 40), torch.float32, 0), _tensor((9, 40), torch.float32, 1)
    got = ops.linear(x, weight, None)
    assert calls == [torch.Size([6, 40])]
    assert got.shape == (2, 3, 9)
    torch.testing.assert_close(got, F.linear(x, weight), rtol=1e-5, atol=1e-5)


def test_many_float32_rows_go_to_the_reference_unchanged(monkeypatch):
    calls = _gemv_calls(monkeypatch)
    rows = packed_linear.MAX_ROWS + 1  # past the GEMV's rows and the packed path's
    x, weight = _tensor((rows, 40), torch.float32, 0), _tensor((9, 40), torch.float32, 1)
    assert torch.equal(ops.linear(x, weight, None), linear_reference(x, weight, None))
    assert calls == []


@pytest.mark.parametrize(
    "case",
    ["dtype_mismatch", "transposed_weight", "bias_of_other_dtype", "no_rows"],
)
def test_inputs_the_gemv_does_not_take_get_the_reference_exactly(case, monkeypatch):
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
    calls = _gemv_calls(monkeypatch)
    x = _tensor((40, 2), torch.float32, 0).t()  # [2, 40], rows strided
    weight = _tensor((9, 40), torch.float32, 1)
    torch.testing.assert_close(ops.linear(x, weight), F.linear(x, weight), rtol=1e-5, atol=1e-5)
    assert calls == [torch.Size([2, 40])]


@pytest.mark.parametrize(
    "flags,native", [(set(), False), ({"avx512_bf16"}, True), ({"amx_bf16"}, True)]
)
def test_16_bit_rows_go_to_the_gemv_unless_torch_multiplies_them_natively(
    flags, native, monkeypatch
):
    monkeypatch.setattr(ops, "cpu_flags", lambda: frozenset(flags))
    ops.dense_linear_max_rows.cache_clear()
    try:
        max_rows = ops.dense_linear_max_rows(torch.bfloat16)
        assert max_rows == (ops.FLOAT32_MAX_ROWS if native else None)
        assert ops.dense_linear_max_rows(torch.float32) == ops.FLOAT32_MAX_ROWS
    finally:
        ops.dense_linear_max_rows.cache_clear()


def test_the_registered_kernel_serves_core_linear_on_the_cpu():
    ops.register()
    from core.ops import provider

    assert provider("linear", "cpu") == ops.PROVIDER
