"""What checkpoints of each kind say about pooling, for the configuration tests."""

from __future__ import annotations

from core.pooling.interface import PoolingType
from core.pooling.runner import CheckpointPooling
from core.pooling.st_config import SentenceTransformersConfig

BERT = CheckpointPooling("BertModel", True, True, PoolingType.CLS, None)
DECODER = CheckpointPooling("LlamaForCausalLM", False, False, PoolingType.LAST, None)
LAST_TOKEN_EMBEDDER = CheckpointPooling(
    "LlamaForCausalLM", False, False, PoolingType.LAST,
    SentenceTransformersConfig(PoolingType.LAST, normalize=True),
)  # fmt: skip
MEAN_DECODER = CheckpointPooling(
    "LlamaForCausalLM", False, False, PoolingType.LAST,
    SentenceTransformersConfig(PoolingType.MEAN, normalize=False),
)  # fmt: skip
