"""Core's reference ops in batch-invariant mode (the kernels of an engine without
core-cpu-kernels): each row's output is bit-identical alone and in any batch, checked by
the conformance kit's own invariance check."""

from __future__ import annotations

import pytest
import torch

from core import batch_invariant
from core.ops import CORE_OPS
from core.testing.test_batch_invariance import ROW_ARGUMENTS, assert_rows_invariant

_CPU = torch.device("cpu")
CASES = [
    pytest.param(name, dtype, id=f"{name}-{str(dtype).removeprefix('torch.')}")
    for name in sorted(ROW_ARGUMENTS)
    for dtype in CORE_OPS.get(name).conformance.tolerances
]


@pytest.fixture
def invariant_mode():
    batch_invariant.set_enabled(True)
    yield
    batch_invariant.set_enabled(False)


@pytest.mark.usefixtures("invariant_mode")
@pytest.mark.parametrize(("name", "dtype"), CASES)
def test_the_reference_gives_a_row_the_same_bits_in_any_batch(name, dtype):
    op = CORE_OPS.get(name)
    assert_rows_invariant(op.reference, op, dtype, _CPU, f"{op.qualname}'s reference")


def test_rowwise_joins_the_rows_results_in_row_order():
    x = torch.arange(12.0).view(2, 3, 2)
    assert torch.equal(batch_invariant.rowwise(lambda r, s: r * s, (x,), 2.0), x * 2)
    assert torch.equal(batch_invariant.rowwise(lambda r, t: r - t, (x, x + 1)), -torch.ones_like(x))
