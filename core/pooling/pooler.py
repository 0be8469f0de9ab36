"""The reference pooler: CLS, MEAN or LAST pooling in plain PyTorch, as sentence-transformers
computes them (its Pooling and Normalize modules)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from core.config import PoolerConfig
from core.pooling.interface import Pooler, PoolingSpans, PoolingType
from core.pooling.params import PoolingParams

__all__ = ["ReferencePooler", "build_pooler"]


class ReferencePooler(Pooler):
    """Pools with `pooling_type`; normalizes unless a request says otherwise, when
    `normalize` (the model's default) is true."""

    def __init__(self, pooling_type: PoolingType, normalize: bool) -> None:
        self.pooling_type = pooling_type
        self.normalize = normalize

    def pool(
        self, hidden: torch.Tensor, spans: PoolingSpans, params: Sequence[PoolingParams]
    ) -> list[torch.Tensor]:
        pooled = _pool(self.pooling_type, hidden.float(), spans)  # [N, hidden_size]
        return [
            _finish(
                vector,
                p.dimensions,
                self.normalize if p.normalize is None else p.normalize,
            )
            for vector, p in zip(pooled, params, strict=True)
        ]


def build_pooler(config: PoolerConfig) -> Pooler:
    """The pooler a resolved pooler config describes (see core.pooling.runner)."""
    if config.pooling_type is None or config.normalize is None:
        raise ValueError(f"pooler config {config} is not resolved from the checkpoint yet")
    return ReferencePooler(PoolingType(config.pooling_type), config.normalize)


def _pool(pooling_type: PoolingType, hidden: torch.Tensor, spans: PoolingSpans) -> torch.Tensor:
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
