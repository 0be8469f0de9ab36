"""Token embedding and the LM head that maps hidden states back onto the vocabulary.

Both hold a matrix W [vocab, hidden] through a LinearMethod, the one the quantization
config gives for embeddings (`QuantizationConfig.get_embedding_method`; unquantized
unless the method keeps them packed, as GGUF's does): the embedding looks rows up
(`LinearMethod.embed`), the head multiplies (`LinearMethod.apply`).

Under tensor parallelism the vocabulary is split: each rank holds an equal, contiguous
share of W's rows (the vocabulary padded with zero rows to a multiple of the ranks; the
padding's logits are cut off). The embedding looks up the ids in its share (zero for the others) and
the ranks' rows are summed; the head computes its share of the logits and the shares are
gathered, so every rank has the full logits (and samples the same tokens).
"""

from __future__ import annotations

from functools import partial
from typing import ClassVar

import torch
from torch import nn

from core.distributed.parallel_state import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    get_tp_group,
)
from core.models.layers.linear import rank_slice
from core.quantization.interface import (
    LinearMethod,
    LinearPartition,
    LinearSplit,
    QuantizationConfig,
)
from core.quantization.unquantized import UnquantizedLinearMethod
from core.quantization.weight_loader import WeightLoader, set_weight_loader


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
        tp_rank, tp_size = get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()
        split = LinearSplit.COLUMN if tp_size > 1 else LinearSplit.REPLICATED
        self.vocab_size = vocab_size
        padded = -(-vocab_size // tp_size) * tp_size
        self.partition = LinearPartition(hidden_size, (padded,), split, tp_rank, tp_size)
        self.params_dtype = dtype
        self.prefix = prefix or self.default_prefix
        method = None if quant_config is None else quant_config.get_embedding_method(self.prefix)
        self.linear_method: LinearMethod = method or UnquantizedLinearMethod()
        self.linear_method.create_weights(self, self.partition, False, dtype)
        for param in self.parameters(recurse=False):
            set_weight_loader(param, partial(_load_rows, param.weight_loader, self))

    @property
    def vocab_rows(self) -> tuple[int, int]:
        """(first id, count) of this rank's share of the vocabulary."""
        count = self.partition.output_sizes_per_partition[0]
        return self.partition.tp_rank * count, count

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, vocab]
        local = self.linear_method.apply(self, hidden, None)  # [N, padded vocab / tp]
        if self.partition.tp_size == 1:
            return local
        return get_tp_group().all_gather(local, dim=-1)[:, : self.vocab_size]


class VocabEmbedding(VocabMatrix):
    """Token ids -> embedding rows."""

    default_prefix = "model.embed_tokens"

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, hidden_size]
        if self.partition.tp_size == 1:
            return self.linear_method.embed(self, input_ids)
        first, count = self.vocab_rows
        local = input_ids - first
        elsewhere = (local < 0) | (local >= count)
        rows = self.linear_method.embed(self, local.masked_fill(elsewhere, 0))
        return get_tp_group().all_reduce(rows.masked_fill_(elsewhere[:, None], 0))


class ScaledVocabEmbedding(VocabEmbedding):
    """Embedding rows times sqrt(hidden_size), the factor rounded to float32 and then to
    the rows' dtype (as transformers' Gemma embedding): a tied LM head reads the unscaled
    matrix."""

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, hidden_size]
        rows = super().forward(input_ids)
        return rows * torch.tensor(rows.shape[-1] ** 0.5).to(rows.dtype)


class LMHead(VocabMatrix):
    """Hidden states -> vocabulary logits by its own W (see TiedLMHead for a shared one)."""

    default_prefix = "lm_head"

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, vocab]
        return self.logits(hidden)


def _load_rows(
    method_loader: WeightLoader, matrix: VocabMatrix, param: nn.Parameter, loaded, shard_id=None
) -> None:
    first, count = matrix.vocab_rows
    real = max(0, min(count, matrix.vocab_size - first))  # the rest is padding: zeros
    loaded = rank_slice(matrix.partition, param, loaded, (first, real), matrix.prefix)
    if real < count and matrix.partition.tp_size > 1:
        padding = loaded.new_zeros((count - real, *loaded.shape[1:]))
        loaded = torch.cat([loaded, padding])
    method_loader(param, loaded, shard_id)


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
