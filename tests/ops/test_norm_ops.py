"""core::rms_norm and core::fused_add_rms_norm: the references and the fakes."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from core.ops import fused_add_rms_norm_reference, rms_norm_reference

# mean([3^2, 4^2]) + 3.5 = 16, so each row is divided by exactly 4.
X = torch.tensor([[3.0, 4.0], [-4.0, 3.0]])
EPS = 3.5
WEIGHT = torch.tensor([2.0, 0.5])


def test_rms_norm_reference_divides_each_row_by_its_rms_and_scales_by_weight():
    expected = torch.tensor([[0.75 * 2, 1.0 * 0.5], [-1.0 * 2, 0.75 * 0.5]])
    assert torch.equal(rms_norm_reference(X, WEIGHT, EPS), expected)


def test_rms_norm_reference_normalizes_the_last_dimension_of_any_rank():
    x = torch.stack([X, X * 2])  # [2, 2, 2]: 2x the input is 2x the rms, same output
    out = rms_norm_reference(x, WEIGHT, 0.0)
    assert torch.equal(out[0], out[1])
    assert torch.equal(out[0], rms_norm_reference(X, WEIGHT, 0.0))


def test_fused_add_rms_norm_reference_normalizes_the_sum_and_returns_it():
    residual = torch.tensor([[1.0, 1.0], [-1.0, 2.0]])
    normed, new_residual = fused_add_rms_norm_reference(X - residual, residual, WEIGHT, EPS)
    assert torch.equal(new_residual, X)
    assert torch.equal(normed, torch.tensor([[1.5, 0.5], [-2.0, 0.375]]))


def test_rms_norm_reference_keeps_the_bfloat16_input_dtype_with_a_bfloat16_weight():
    out = rms_norm_reference(X.bfloat16(), WEIGHT.bfloat16(), EPS)
    assert out.dtype == torch.bfloat16 and torch.equal(
        out.float(), torch.tensor([[1.5, 0.5], [-2.0, 0.375]])
    )


# (x dtype, residual dtype, weight dtype): the fakes must promote as the references do.
DTYPES = [
    (torch.float32, torch.float32, torch.float32),
    (torch.bfloat16, torch.bfloat16, torch.bfloat16),
    (torch.bfloat16, torch.bfloat16, torch.float32),
    (torch.float16, torch.float32, torch.float16),
]


def _metadata(tensors) -> list[tuple[torch.Size, torch.dtype]]:
    return [(t.shape, t.dtype) for t in tensors]


@pytest.mark.parametrize("x_dtype, residual_dtype, weight_dtype", DTYPES)
def test_the_fakes_give_the_references_shapes_and_dtypes(x_dtype, residual_dtype, weight_dtype):
    x, residual = torch.randn(3, 4, 5, dtype=x_dtype), torch.randn(3, 4, 5, dtype=residual_dtype)
    weight = torch.randn(5, dtype=weight_dtype)
    expected = _metadata(
        [
            rms_norm_reference(x, weight, 1e-6),
            *fused_add_rms_norm_reference(x, residual, weight, 1e-6),
        ]
    )
    with FakeTensorMode() as mode:
        fx, fr, fw = (mode.from_tensor(t) for t in (x, residual, weight))
        got = [
            torch.ops.core.rms_norm(fx, fw, 1e-6),
            *torch.ops.core.fused_add_rms_norm(fx, fr, fw, 1e-6),
        ]
    assert _metadata(got) == expected


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_ops_pass_torch_library_opcheck(dtype):
    x, residual, weight = (torch.randn(shape, dtype=dtype) for shape in ((3, 8), (3, 8), (8,)))
    torch.library.opcheck(torch.ops.core.rms_norm.default, (x, weight, 1e-6))
    torch.library.opcheck(torch.ops.core.fused_add_rms_norm.default, (x, residual, weight, 1e-6))
