"""The reference poolers, in plain PyTorch: CLS, MEAN or LAST pooling as sentence-transformers
computes them (its Pooling and Normalize modules) for embeddings, and a model's
classification head over the pooled (or every) hidden state for the classifier tasks."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from core.config import PoolerConfig
from core.pooling.interface import Pooler, PoolingSpans, PoolingType
from core.pooling.params import PoolingParams
from core.pooling.tasks import score_uses_sigmoid

__all__ = ["ClassifierPooler", "ReferencePooler", "build_pooler", "pool_spans"]


class ReferencePooler(Pooler):
    """Pools with `pooling_type`; normalizes unless a request says otherwise, when
    `normalize` (the model's default) is true."""

    def __init__(self, pooling_type: PoolingType, normalize: bool) -> None:
        self.pooling_type = pooling_type
        self.normalize = normalize

    def pool(
        self, hidden: torch.Tensor, spans: PoolingSpans, params: Sequence[PoolingParams]
    ) -> list[torch.Tensor]:
        pooled = pool_spans(self.pooling_type, hidden.float(), spans)  # [N, hidden_size]
        return [
            _finish(
                vector,
                p.dimensions,
                self.normalize if p.normalize is None else p.normalize,
            )
            for vector, p in zip(pooled, params, strict=True)
        ]


class ClassifierPooler(Pooler):
    """Pools with `pooling_type`, then applies `head` (the model's classifier: [N, hidden]
    -> [N, num_labels] logits) and the request's task activation (core.pooling.tasks):
    classify a softmax over the labels (a sigmoid for one label); score the sigmoid of its
    one logit, as vLLM's default for one-label cross-encoders, or (`score_sigmoid` False:
    the checkpoint says so) the logit itself; token_classify the head and the classify
    activation on every prompt token, flattened row-major. A request with
    `use_activation` False gets the raw logits."""

    def __init__(
        self,
        pooling_type: PoolingType,
        head: Callable[[torch.Tensor], torch.Tensor],
        score_sigmoid: bool = True,
    ) -> None:
        self.pooling_type = pooling_type
        self.head = head
        self.score_sigmoid = score_sigmoid  # False: the checkpoint scores with raw logits

    def pool(
        self, hidden: torch.Tensor, spans: PoolingSpans, params: Sequence[PoolingParams]
    ) -> list[torch.Tensor]:
        logits = self.head(pool_spans(self.pooling_type, hidden, spans)).float()  # [N, L]
        outputs = []
        for i, p in enumerate(params):
            if p.task == "token_classify":
                rows = self.head(hidden[spans.starts[i] : spans.ends[i]]).float()  # [T_i, L]
                outputs.append(_activate(rows, p.use_activation).flatten())
            elif p.task == "score":
                sigmoid = p.use_activation is not False and self.score_sigmoid
                outputs.append(_activate(logits[i], sigmoid))
            else:
                outputs.append(_activate(logits[i], p.use_activation))
        return outputs


def build_pooler(config: PoolerConfig, model: nn.Module) -> Pooler:
    """The pooler a resolved pooler config describes (see core.pooling.runner) for `model`:
    its classification head's (core.pooling.classifier) when it has one, else embeddings."""
    if config.pooling_type is None or config.normalize is None:
        raise ValueError(f"pooler config {config} is not resolved from the checkpoint yet")
    pooling_type = PoolingType(config.pooling_type)
    if "classify" in getattr(model, "pooling_tasks", ()):
        return ClassifierPooler(
            pooling_type, model.classify, score_uses_sigmoid(model.config.hf_config)
        )
    return ReferencePooler(pooling_type, config.normalize)


def pool_spans(
    pooling_type: PoolingType, hidden: torch.Tensor, spans: PoolingSpans
) -> torch.Tensor:
    """[N, hidden_size]: each span's first row, last row, or the mean of its rows."""
    if pooling_type is PoolingType.CLS:
        return hidden[spans.starts]
    if pooling_type is PoolingType.LAST:
        return hidden[spans.ends - 1]
    return torch.stack(
        [hidden[start:end].mean(dim=0) for start, end in zip(spans.starts, spans.ends, strict=True)]
    )


def _finish(vector: torch.Tensor, dimensions: int | None, normalize: bool) -> torch.Tensor:
    """`vector` [H] cut to its first `dimensions` values (all when None), then scaled to unit
    L2 norm when `normalize` (sentence-transformers' Normalize: eps 1e-12)."""
    if dimensions is not None:
        vector = vector[:dimensions]
    return F.normalize(vector, p=2.0, dim=-1) if normalize else vector


def _activate(logits: torch.Tensor, use_activation: bool | None) -> torch.Tensor:
    """`logits` [..., L] through a softmax over the labels (a sigmoid for one label), unless
    `use_activation` is False (None: on)."""
    if use_activation is False:
        return logits
    return torch.sigmoid(logits) if logits.shape[-1] == 1 else torch.softmax(logits, dim=-1)
