"""Decoders with a classification head: transformers' `LlamaForSequenceClassification`,
`Qwen2ForSequenceClassification` (reward models and decoder rerankers are saved so).

transformers runs the decoder and a bias-free linear `score` [hidden -> num_labels] on the
last prompt token (its last non-padding one; core never pads). These only pool
(`pooling_only`), from the last token: classify and score as the BERT cross-encoders do,
and token_classify, the score head on every prompt token (core.pooling.tasks; vLLM's
reward outputs, `LLM.reward`), which needs every prompt token computed in the forward
that pools it (core.pooling.runner.whole_prompt_reason).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

import torch
from torch import nn

from core.models.arch_config import ArchConfig
from core.models.hf_weights import load_hf_weights
from core.models.llama import LlamaForCausalLM
from core.models.qwen2 import Qwen2ForCausalLM
from core.pooling.tasks import num_labels
from core.quantization.interface import QuantizationConfig

__all__ = ["LlamaForSequenceClassification", "Qwen2ForSequenceClassification"]


class DecoderClassifier:
    """Mixin (before the decoder class) for a decoder saved with transformers' `score`
    head instead of its language-model head ("model."-prefixed tensors, "score.weight")."""

    has_lm_head: ClassVar[bool] = False
    pooling_only: ClassVar[bool] = True
    pooling_tasks: ClassVar[tuple[str, ...]] = ("classify", "score", "token_classify")

    def __init__(
        self,
        config: ArchConfig,
        quant_config: QuantizationConfig | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__(config, quant_config, dtype)
        labels = num_labels(config.hf_config)
        self.score = nn.Linear(config.hidden_size, labels, bias=False, dtype=dtype)

    def classify(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, labels]
        return self.score(hidden)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """As the decoder's, with the names as saved (the score head beside "model.")."""
        load_hf_weights(self, weights, self.stacked_params, self._skips_weight, self.expert_params)


class LlamaForSequenceClassification(DecoderClassifier, LlamaForCausalLM):
    pass


class Qwen2ForSequenceClassification(DecoderClassifier, Qwen2ForCausalLM):
    pass
