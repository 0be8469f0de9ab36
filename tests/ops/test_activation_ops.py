"""core::silu_and_mul: the reference and the fake."""

from __future__ import annotations

import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from core.ops import silu_and_mul_reference


def _silu(g: float) -> float:
    return g / (1 + math.exp(-g))


def test_the_reference_multiplies_silu_of_the_first_half_by_the_second():
    x = torch.tensor([[0.0, 1.0, -2.0, 5.0, 3.0, 0.5], [4.0, -1.0, 2.5, 2.0, -2.0, 0.0]])
    want = torch.tensor(
        [
            [0.0 * 5.0, _silu(1.0) * 3.0, _silu(-2.0) * 0.5],
            [_silu(4.0) * 2.0, _silu(-1.0) * -2.0, 0.0],
        ]
    )
    torch.testing.assert_close(silu_and_mul_reference(x), want, rtol=1e-6, atol=0.0)


def test_the_reference_rounds_silu_to_the_half_type_before_the_product():
    # silu(1.5) = 1.22636...: bfloat16 rounds it to 1.2265625; times 3 that is 3.6796875,
    # halfway between bfloat16's 3.671875 and 3.6875, and the tie goes to the even 3.6875.
    # The exact 3.6791 rounded once would be 3.671875.
    x = torch.tensor([[1.5, 3.0]], dtype=torch.bfloat16)
    assert silu_and_mul_reference(x).item() == 3.6875


def test_an_odd_last_dimension_is_refused_naming_x():
    with pytest.raises(
        ValueError, match=r"x of silu_and_mul must be \[..., 2 \* I\], got \(2, 3\)"
    ):
        silu_and_mul_reference(torch.zeros(2, 3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_fake_gives_the_references_shape_and_dtype(dtype):
    x = torch.randn(3, 4, 10, dtype=dtype)
    want = silu_and_mul_reference(x)
    with FakeTensorMode() as mode:
        got = torch.ops.core.silu_and_mul(mode.from_tensor(x))
    assert (got.shape, got.dtype) == (want.shape, want.dtype) == ((3, 4, 5), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_op_passes_torch_library_opcheck(dtype):
    torch.library.opcheck(torch.ops.core.silu_and_mul.default, (torch.randn(3, 8, dtype=dtype),))
