"""core::rotary_embedding: the reference (in place, transformers' arithmetic) and the fake."""

from __future__ import annotations

import cmath

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from core.ops import rotary_embedding_reference

ANGLES = torch.tensor([[0.0, 0.0], [0.5, 0.25], [1.0, 0.5]])  # [positions, D / 2]: D = 4


def _rotated(x: list[float], angles: list[float]) -> list[float]:
    """Pair (x[i], x[i + D/2]) as the complex x[i] + j x[i + D/2], turned by angles[i]."""
    half = len(x) // 2
    turned = [complex(x[i], x[half + i]) * cmath.exp(1j * angles[i]) for i in range(half)]
    return [z.real for z in turned] + [z.imag for z in turned]


def test_each_head_is_turned_by_its_tokens_angles_in_place():
    qkv = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 9.0, 9.0, 9.0]] * 2)
    query, key = qkv[:, :8].view(2, 2, 4), qkv[:, 8:].view(2, 1, 4)  # views, as in a model
    positions = torch.tensor([2, 1])
    rotary_embedding_reference(positions, query, key, ANGLES.cos(), ANGLES.sin())
    want = [
        _rotated([1, 2, 3, 4], [1.0, 0.5]) + _rotated([5, 6, 7, 8], [1.0, 0.5]),
        _rotated([1, 2, 3, 4], [0.5, 0.25]) + _rotated([5, 6, 7, 8], [0.5, 0.25]),
    ]
    torch.testing.assert_close(qkv[:, :8], torch.tensor(want), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(qkv[0, 8:], torch.tensor(_rotated([9, 9, 9, 9], [1.0, 0.5])))
    torch.testing.assert_close(qkv[1, 8:], torch.tensor(_rotated([9, 9, 9, 9], [0.5, 0.25])))


def test_position_zero_leaves_query_and_key_unchanged():
    query, key = torch.randn(1, 3, 4), torch.randn(1, 1, 4)
    want_query, want_key = query.clone(), key.clone()
    rotary_embedding_reference(torch.tensor([0]), query, key, ANGLES.cos(), ANGLES.sin())
    assert torch.equal(query, want_query) and torch.equal(key, want_key)


def test_the_reference_rounds_cos_and_sin_to_the_half_type_first():
    # cos(1) = 0.5403 rounds to bfloat16's 0.5390625; 5 times that is 2.6953125, a tie
    # between bfloat16's 2.6875 and 2.703125 that goes to the even 2.6875. The float32
    # cos would give 2.7015, rounded to 2.703125.
    query = torch.tensor([[[5.0, 0.0]]], dtype=torch.bfloat16)
    key = torch.zeros(1, 1, 2, dtype=torch.bfloat16)
    angles = torch.tensor([[0.0], [1.0]])
    rotary_embedding_reference(torch.tensor([1]), query, key, angles.cos(), angles.sin())
    assert query[0, 0, 0].item() == 2.6875


def test_the_fake_returns_nothing_and_the_op_passes_opcheck():
    query, key = torch.randn(3, 2, 4), torch.randn(3, 1, 4)
    args = (torch.tensor([0, 2, 1]), query, key, ANGLES.cos(), ANGLES.sin())
    with FakeTensorMode() as mode:
        assert torch.ops.core.rotary_embedding(*(mode.from_tensor(a) for a in args)) is None
    torch.library.opcheck(torch.ops.core.rotary_embedding.default, args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_op_writes_through_views_under_compilation(dtype):
    qkv = torch.randn(3, 12, dtype=dtype)
    want = qkv.clone()
    positions, cos, sin = torch.tensor([0, 2, 1]), ANGLES.cos(), ANGLES.sin()
    rotary_embedding_reference(positions, want[:, :8].view(3, 2, 4), want[:, 8:].view(3, 1, 4),
                               cos, sin)  # fmt: skip

    def step(qkv: torch.Tensor) -> torch.Tensor:
        query, key = qkv[:, :8].view(3, 2, 4), qkv[:, 8:].view(3, 1, 4)
        torch.ops.core.rotary_embedding(positions, query, key, cos, sin)
        return qkv * 1

    got = torch.compile(step, backend="aot_eager", fullgraph=True)(qkv)
    assert torch.equal(got, want) and torch.equal(qkv, want)
