"""RoBERTa and XLM-RoBERTa: BERT's encoder (core.models.bert) with RoBERTa's positions.

transformers' RoBERTa numbers positions from `padding_idx + 1` (the config's
`pad_token_id`, 1 for XLM-R): the rows before it belong to padding, so position p reads
row p + padding_idx + 1 and the context is that much shorter than the table. A prompt that
holds the padding token itself would get transformers' padding position there; core
numbers every prompt token. There is one token type (RoBERTa's tokenizers give a text pair
type 0 throughout).

Checkpoints: `XLMRobertaModel` / `RobertaModel` (embedding models, pooled by [CLS] = <s>
unless their sentence-transformers config says otherwise) and
`XLMRobertaForSequenceClassification` / `RobertaForSequenceClassification`
(cross-encoders and classifiers, e.g. BAAI/bge-reranker-v2-m3), whose head is RoBERTa's:
dense, tanh, then out_proj, on the <s> token's last hidden state.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from core.models.arch_config import ArchConfig
from core.models.bert import BertModel
from core.pooling.tasks import num_labels
from core.quantization.interface import QuantizationConfig

__all__ = ["RobertaForSequenceClassification", "RobertaModel"]


class RobertaModel(BertModel):
    """Token ids to RoBERTa's last hidden states [T, hidden]."""

    checkpoint_prefix: ClassVar[str] = "roberta."
    unused_prefixes: ClassVar[tuple[str, ...]] = ("lm_head.", "pooler.", "embeddings.position_ids")

    @classmethod
    def position_offset(cls, config: ArchConfig) -> int:
        return int(config.hf_config.get("pad_token_id", 1)) + 1


class RobertaClassificationHead(nn.Module):
    """transformers' RobertaClassificationHead on an already pooled hidden state."""

    def __init__(self, hidden_size: int, num_labels: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size, dtype=dtype)
        self.out_proj = nn.Linear(hidden_size, num_labels, dtype=dtype)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, labels]
        return self.out_proj(torch.tanh(self.dense(pooled)))


class RobertaForSequenceClassification(RobertaModel):
    """A RoBERTa cross-encoder or classifier (transformers' class of that name)."""

    pooling_tasks: ClassVar[tuple[str, ...]] = ("classify", "score")
    unused_prefixes: ClassVar[tuple[str, ...]] = ("embeddings.position_ids",)

    def __init__(
        self,
        config: ArchConfig,
        quant_config: QuantizationConfig | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__(config, quant_config, dtype)
        self.classifier = RobertaClassificationHead(
            config.hidden_size, num_labels(config.hf_config), dtype
        )

    def classify(self, pooled: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, labels]
        return self.classifier(pooled)
