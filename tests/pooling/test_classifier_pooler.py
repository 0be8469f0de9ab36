"""The classifier pooler on hand-sized hidden states: two requests, rows [0, 3) and [3, 5),
and a head that doubles the first value and negates the second (two labels) or sums them
(one label)."""

from __future__ import annotations

import math

import pytest
import torch

from core.pooling.interface import PoolingSpans, PoolingType
from core.pooling.params import PoolingParams
from core.pooling.pooler import ClassifierPooler

HIDDEN = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 1.0], [0.5, 0.5], [1.0, 3.0]])
SPANS = PoolingSpans(starts=torch.tensor([0, 3]), ends=torch.tensor([3, 5]))


def two_labels(x: torch.Tensor) -> torch.Tensor:
    return torch.stack([2 * x[..., 0], -x[..., 1]], dim=-1)


def one_label(x: torch.Tensor) -> torch.Tensor:
    return x.sum(dim=-1, keepdim=True)


def softmax(a: float, b: float) -> list[float]:
    return [math.exp(a) / (math.exp(a) + math.exp(b)), math.exp(b) / (math.exp(a) + math.exp(b))]


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def test_classify_is_the_softmax_of_the_pooled_rows_logits():
    pooler = ClassifierPooler(PoolingType.CLS, two_labels)
    first, second = pooler.pool(HIDDEN, SPANS, [PoolingParams(task="classify")] * 2)
    assert first.tolist() == pytest.approx(softmax(2.0, 0.0))
    assert second.tolist() == pytest.approx(softmax(1.0, -0.5))


def test_last_pooling_reads_each_requests_last_row():
    pooler = ClassifierPooler(PoolingType.LAST, two_labels)
    first, second = pooler.pool(HIDDEN, SPANS, [PoolingParams(task="classify")] * 2)
    assert first.tolist() == pytest.approx(softmax(4.0, -1.0))
    assert second.tolist() == pytest.approx(softmax(2.0, -3.0))


def test_one_label_scores_and_classifies_with_its_sigmoid_unless_activation_is_off():
    pooler = ClassifierPooler(PoolingType.CLS, one_label)
    params = [PoolingParams(task="score"), PoolingParams(task="classify", use_activation=False)]
    score, raw = pooler.pool(HIDDEN, SPANS, params)
    assert score.tolist() == pytest.approx([sigmoid(1.0)])
    assert raw.tolist() == [1.0]


def test_token_classify_gives_every_span_row_its_probabilities_row_major():
    pooler = ClassifierPooler(PoolingType.LAST, two_labels)
    params = [PoolingParams(task="classify"), PoolingParams(task="token_classify")]
    _, rows = pooler.pool(HIDDEN, SPANS, params)
    assert rows.tolist() == pytest.approx([*softmax(1.0, -0.5), *softmax(2.0, -3.0)])


def test_a_cross_encoder_saved_with_an_identity_activation_scores_with_its_raw_logit():
    pooler = ClassifierPooler(PoolingType.CLS, one_label, score_sigmoid=False)
    score, classified = pooler.pool(
        HIDDEN, SPANS, [PoolingParams(task="score"), PoolingParams(task="classify")]
    )
    assert (score.tolist(), classified.tolist()) == ([1.0], pytest.approx([sigmoid(1.0)]))
