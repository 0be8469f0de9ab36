"""Token embedding and the LM head that maps hidden states back onto the vocabulary.

Both hold a matrix W [vocab, hidden] through a LinearMethod, the one the quantization
config gives for embeddings (`QuantizationConfig.get_embedding_method`; unquantized
unless the method keeps them packed, as GGUF's does): the embedding looks rows up
(`LinearMethod.embed`), the head multiplies (`LinearMethod.apply`).
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from core.quantization.interface import (
    LinearMethod,
    LinearPartition,
    LinearSplit,
    QuantizationConfig,
)
from core.quantization.unquantized import UnquantizedLinearMethod


class VocabMatrix(nn.Module):
    """W [vocab_size, hidden_size] as a linear layer hidden -> vocab, stored by its method.

    `prefix` is the module's name in the model (default: the subclass's
    `default_prefix`), the name the quantization config is asked about; the parameters
    are the method's ("weight" unquantized), directly on this module.
    """

    default_prefix: ClassVar[str]

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        dtype: torch.dtype,
        quant_config: QuantizationConfig | None = None,
        prefix: str | None = None,
    ) -> None:
        super().__init__()
        self.partition = LinearPartition(hidden_size, (vocab_size,), LinearSplit.REPLICATED)
        self.params_dtype = dtype
        self.prefix = prefix or self.default_prefix
        method = None if quant_config is None else quant_config.get_embedding_method(self.prefix)
        self.linear_method: LinearMethod = method or UnquantizedLinearMethod()
        self.linear_method.create_weights(self, self.partition, False, dtype)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, vocab]
        return self.linear_method.apply(self, hidden, None)


class VocabEmbedding(VocabMatrix):
    """Token ids -> embedding rows."""

    default_prefix = "model.embed_tokens"

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, hidden_size]
        return self.linear_method.embed(self, input_ids)


class LMHead(VocabMatrix):
    """Hidden states -> vocabulary logits by its own W (see TiedLMHead for a shared one)."""

    default_prefix = "lm_head"

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, vocab]
        return self.logits(hidden)


class TiedLMHead(nn.Module):
    """An LM head that multiplies by the embedding's matrix, however its method stores it.

    It owns no parameters, so loading the embedding loads the head and
    `named_parameters()` lists the matrix once, under the embedding's name.
    """

    def __init__(self, embedding: VocabEmbedding) -> None:
        super().__init__()
        # A plain list: as a registered submodule the embedding would appear twice in the
        # module tree.
        self._embedding = [embedding]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, vocab]
        return self._embedding[0].logits(hidden)
