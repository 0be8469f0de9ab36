"""The reference pooler on hand-sized hidden states: two requests, rows [0, 3) and [3, 5)."""

from __future__ import annotations

import pytest
import torch

from core.pooling.interface import PoolingSpans, PoolingType
from core.pooling.params import PoolingParams
from core.pooling.pooler import ReferencePooler

HIDDEN = torch.tensor(
    [[1.0, 0.0, 0.0], [3.0, 4.0, 6.0], [5.0, 2.0, 0.0], [0.0, 2.0, 0.0], [3.0, 4.0, 12.0]]
)
SPANS = PoolingSpans(starts=torch.tensor([0, 3]), ends=torch.tensor([3, 5]))
RAW = [PoolingParams(normalize=False)] * 2


@pytest.mark.parametrize(
    ("pooling_type", "expected"),
    [
        (PoolingType.CLS, [[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]]),
        (PoolingType.LAST, [[5.0, 2.0, 0.0], [3.0, 4.0, 12.0]]),
        (PoolingType.MEAN, [[3.0, 2.0, 2.0], [1.5, 3.0, 6.0]]),
    ],
)
def test_each_pooling_type_reads_its_rows(pooling_type, expected):
    vectors = ReferencePooler(pooling_type, normalize=True).pool(HIDDEN, SPANS, RAW)
    assert [v.tolist() for v in vectors] == expected


def test_vectors_are_normalized_unless_the_request_says_otherwise():
    pooler = ReferencePooler(PoolingType.LAST, normalize=True)
    unit, raw = pooler.pool(HIDDEN, SPANS, [PoolingParams(), PoolingParams(normalize=False)])
    assert unit.tolist() == pytest.approx([5 / 29**0.5, 2 / 29**0.5, 0.0])
    assert raw.tolist() == [3.0, 4.0, 12.0]


def test_dimensions_cut_the_vector_before_it_is_normalized():
    pooler = ReferencePooler(PoolingType.LAST, normalize=False)
    _, cut = pooler.pool(
        HIDDEN, SPANS, [PoolingParams(), PoolingParams(dimensions=2, normalize=True)]
    )
    assert cut.tolist() == pytest.approx([0.6, 0.8])  # [3, 4] / 5, not [3, 4] / 13


def test_vectors_are_float32_whatever_the_model_dtype():
    vectors = ReferencePooler(PoolingType.MEAN, normalize=False).pool(HIDDEN.bfloat16(), SPANS, RAW)
    assert {v.dtype for v in vectors} == {torch.float32}
