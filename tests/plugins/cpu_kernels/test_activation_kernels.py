"""The C++ core::silu_and_mul kernel against core's reference and against float64.

The kernel computes silu(gate) * up in float32 and rounds once. Against the reference
(float32: to 1e-5 relative; half types, which the reference rounds twice: within two units
in the last place) and against the exact float64 value rounded once to the dtype.
"""

from __future__ import annotations

import pytest
import torch

from core.ops import silu_and_mul_reference

ops = pytest.importorskip(
    "core_cpu_kernels.ops", reason="core-cpu-kernels is not installed (optional plugin)"
)

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# Versus the reference: float32 differs only in the exponential's last bits; half types
# also in the reference's rounding of silu(gate) before the product.
TOLERANCES = {torch.float32: 1e-5, torch.bfloat16: 2 * 2**-7, torch.float16: 2 * 2**-10}
INTERMEDIATE_SIZES = [1, 7, 1536]  # one element, odd, SmolLM2's
NUM_ROWS = [1, 37]  # a decode row; more than one thread's share at 1536


def _inputs(shape, dtype, seed=0, scale=4.0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen) * scale).to(dtype)


def _exact(x: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up in float64 from x's (rounded) values, by its definition."""
    gate, up = x.double().chunk(2, dim=-1)
    return gate / (1 + torch.exp(-gate)) * up


def _assert_near_reference(got: torch.Tensor, x: torch.Tensor) -> None:
    want = silu_and_mul_reference(x)
    assert got.dtype == want.dtype and got.shape == want.shape
    tol = TOLERANCES[x.dtype]
    torch.testing.assert_close(got, want, rtol=tol, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("size", INTERMEDIATE_SIZES)
@pytest.mark.parametrize("num_rows", NUM_ROWS)
def test_silu_and_mul_matches_the_reference(dtype, size, num_rows):
    x = _inputs((num_rows, 2 * size), dtype)
    _assert_near_reference(ops.silu_and_mul(x), x)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_half_types_are_the_exact_product_rounded_once(dtype):
    x = _inputs((37, 2 * 1536), dtype)
    got, exact = ops.silu_and_mul(x), _exact(x)
    rounded_once = exact.to(dtype)
    # Only where float32's own error straddles a rounding boundary may a value differ,
    # and then by one unit in the last place.
    assert (got != rounded_once).float().mean() < 0.005
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(got.double(), exact, rtol=eps, atol=1e-7)


def test_float32_is_within_float32_precision_of_the_exact_value():
    x = _inputs((5, 2 * 1536), torch.float32)
    torch.testing.assert_close(ops.silu_and_mul(x).double(), _exact(x), rtol=1e-6, atol=1e-12)


def test_large_gates_neither_overflow_nor_lose_the_product():
    gate = torch.tensor([[-1e4, -200.0, -88.0, -30.0, 0.0, 30.0, 88.0, 200.0, 1e4]])
    x = torch.cat((gate, torch.full_like(gate, 3.0)), dim=-1)
    got = ops.silu_and_mul(x)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), _exact(x), rtol=1e-6, atol=1e-12)


def test_strided_rows_are_read_where_they_are():
    rows = _inputs((6, 2 * 24 + 8), torch.bfloat16)[::2, : 2 * 24]  # [3, 48], rows 112 apart
    assert not rows.is_contiguous()
    _assert_near_reference(ops.silu_and_mul(rows), rows)


def test_no_rows_give_no_rows():
    assert ops.silu_and_mul(torch.empty(0, 14)).shape == (0, 7)


UNTAKEN = {
    "float64": _inputs((3, 8), torch.float64),
    "3-D": _inputs((2, 3, 8), torch.float32),
    "strided last dimension": _inputs((8, 3), torch.float32).t(),
}


@pytest.mark.parametrize("case", sorted(UNTAKEN))
def test_inputs_the_kernel_does_not_take_get_the_reference_exactly(case):
    x = UNTAKEN[case]
    assert torch.equal(ops.silu_and_mul(x), silu_and_mul_reference(x))


def test_an_odd_last_dimension_is_refused_naming_x():
    with pytest.raises(
        ValueError, match=r"x of silu_and_mul must be \[..., 2 \* I\], got \(3, 5\)"
    ):
        ops.silu_and_mul(torch.zeros(3, 5))
