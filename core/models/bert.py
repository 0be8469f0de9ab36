"""BERT: the encoder of the classic sentence-transformers embedding models.

transformers' BertModel: learned absolute position embeddings, post-LayerNorm residual
blocks, and bidirectional attention over each request's whole prompt
(`AttentionType.ENCODER_ONLY`: the reference attention backend serves it, and the engine
computes each prompt in one step). It has no language-model head, so it only runs with
`--runner pooling` (`pooling_only`), pooled by [CLS] unless the checkpoint's
sentence-transformers config says otherwise (`default_pooling_type`). An input is one
segment (token type 0) unless the runner passes `token_type_ids` (`takes_token_type_ids`):
a text pair scored by a cross-encoder, its second text of type 1.

Model interface as in core.models.llama, less `compute_logits`, plus `max_model_len(config)`
(the longest prompt its position table serves). Checkpoints: `BertModel` as transformers
saves it, `BertForMaskedLM` (the same encoder under "bert.", its MLM head not loaded) and
`BertForSequenceClassification` (a cross-encoder or classifier: the encoder, BERT's
pooler and a classifier; core.pooling.tasks). RoBERTa reuses the encoder (core.models.
roberta): the same layers, its positions offset by `position_offset`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from functools import partial
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from core.attention.interface import AttentionType
from core.attention.layer import Attention
from core.distributed.parallel_state import get_tensor_model_parallel_world_size
from core.models.arch_config import ArchConfig
from core.models.hf_weights import StackedParam, load_hf_weights
from core.models.layers import MergedLinear, QKVLinear, RowParallelLinear, VocabEmbedding
from core.pooling.tasks import num_labels
from core.quantization.interface import QuantizationConfig

__all__ = ["BertForMaskedLM", "BertForSequenceClassification", "BertModel"]

_STACKED_PARAMS = (
    StackedParam("qkv_proj", "query", "q"),
    StackedParam("qkv_proj", "key", "k"),
    StackedParam("qkv_proj", "value", "v"),
)
_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,  # the exact (erf) GELU
    "gelu_new": partial(F.gelu, approximate="tanh"),
    "gelu_pytorch_tanh": partial(F.gelu, approximate="tanh"),
    "silu": F.silu,
}


class BertEmbeddings(nn.Module):
    def __init__(
        self,
        config: ArchConfig,
        quant_config: QuantizationConfig | None,
        dtype: torch.dtype,
        position_offset: int = 0,
    ) -> None:
        super().__init__()
        hidden = config.hidden_size
        # The row of position 0 (RoBERTa's first rows are not positions).
        self.position_offset = position_offset
        self.word_embeddings = VocabEmbedding(
            config.vocab_size, hidden, dtype, quant_config, "embeddings.word_embeddings"
        )
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, hidden, dtype=dtype)
        self.token_type_embeddings = nn.Embedding(
            max(config.type_vocab_size, 1), hidden, dtype=dtype
        )
        self.LayerNorm = nn.LayerNorm(hidden, eps=config.rms_norm_eps, dtype=dtype)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # [T], [T], [T] -> [T, hidden]; no token_type_ids: every token is of type 0.
        if token_type_ids is None:
            types = self.token_type_embeddings.weight[0]
        else:
            types = self.token_type_embeddings(token_type_ids)
        hidden = self.word_embeddings(input_ids) + types
        return self.LayerNorm(hidden + self.position_embeddings(positions + self.position_offset))


class BertSelfAttention(nn.Module):
    def __init__(
        self,
        config: ArchConfig,
        quant_config: QuantizationConfig | None,
        prefix: str,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        num_heads = config.num_attention_heads // get_tensor_model_parallel_world_size()
        head_dim = config.head_dim
        self.qkv_proj = QKVLinear(
            config.hidden_size,
            head_dim,
            config.num_attention_heads,
            config.num_attention_heads,
            bias=True,
            quant_config=quant_config,
            prefix=f"{prefix}.qkv_proj",
            dtype=dtype,
        )
        self.attn = Attention(
            layer_name=f"{prefix}.attn",
            num_heads=num_heads,
            head_size=head_dim,
            scale=head_dim**-0.5,
            num_kv_heads=num_heads,
            attn_type=AttentionType.ENCODER_ONLY,
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # [T, hidden] -> [T, H * D]
        q, k, v = self.qkv_proj(hidden).split(
            [self.qkv_proj.q_size, self.qkv_proj.kv_size, self.qkv_proj.kv_size], dim=-1
        )
        return self.attn(q, k, v)


class BertResidualOutput(nn.Module):
    """A projection back to the hidden size, then LayerNorm of its sum with the block's
    input (transformers' BertSelfOutput and BertOutput)."""

    def __init__(
        self,
        input_size: int,
        config: ArchConfig,
        quant_config: QuantizationConfig | None,
        prefix: str,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.dense = RowParallelLinear(
            input_size, hidden, True, quant_config, f"{prefix}.dense", dtype
        )
        self.LayerNorm = nn.LayerNorm(hidden, eps=config.rms_norm_eps, dtype=dtype)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:  # [T, hidden]
        return self.LayerNorm(self.dense(x) + residual)


class BertAttention(nn.Module):
    def __init__(
        self,
        config: ArchConfig,
        quant_config: QuantizationConfig | None,
        prefix: str,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        # Named as in transformers ("attention.self"), so checkpoint names load unchanged.
        self.self = BertSelfAttention(config, quant_config, f"{prefix}.self", dtype)
        width = config.num_attention_heads * config.head_dim
        self.output = BertResidualOutput(width, config, quant_config, f"{prefix}.output", dtype)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # [T, hidden] -> [T, hidden]
        return self.output(self.self(hidden), hidden)


class BertIntermediate(nn.Module):
    def __init__(
        self,
        config: ArchConfig,
        quant_config: QuantizationConfig | None,
        prefix: str,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        # Column-parallel: one output, split across tensor-parallel ranks.
        self.dense = MergedLinear(
            config.hidden_size, [config.intermediate_size], True, quant_config,
            f"{prefix}.dense", dtype,
        )  # fmt: skip
        self.act_fn = _ACTIVATIONS[config.hidden_act]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # [T, hidden] -> [T, inter]
        return self.act_fn(self.dense(hidden))


class BertLayer(nn.Module):
    def __init__(
        self,
        config: ArchConfig,
        quant_config: QuantizationConfig | None,
        prefix: str,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.attention = BertAttention(config, quant_config, f"{prefix}.attention", dtype)
        self.intermediate = BertIntermediate(config, quant_config, f"{prefix}.intermediate", dtype)
        self.output = BertResidualOutput(
            config.intermediate_size, config, quant_config, f"{prefix}.output", dtype
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # [T, hidden] -> [T, hidden]
        hidden = self.attention(hidden)
        return self.output(self.intermediate(hidden), hidden)


class BertEncoder(nn.Module):
    def __init__(
        self, config: ArchConfig, quant_config: QuantizationConfig | None, dtype: torch.dtype
    ) -> None:
        super().__init__()
        self.layer = nn.ModuleList(
            BertLayer(config, quant_config, f"encoder.layer.{i}", dtype)
            for i in range(config.num_hidden_layers)
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # [T, hidden] -> [T, hidden]
        for layer in self.layer:
            hidden = layer(hidden)
        return hidden


class BertModel(nn.Module):
    """Token ids to the encoder's last hidden states [T, hidden]."""

    pooling_only: ClassVar[bool] = True
    bidirectional: ClassVar[bool] = True
    default_pooling_type: ClassVar[str] = "CLS"
    takes_token_type_ids: ClassVar[bool] = True
    # What the checkpoint's tensor names start with inside a task class ("bert.encoder...").
    checkpoint_prefix: ClassVar[str] = "bert."
    # Checkpoint tensors this class does not run: the MLM head, BERT's own tanh pooler
    # (which sentence-transformers does not use) and a position-id buffer older
    # checkpoints saved.
    unused_prefixes: ClassVar[tuple[str, ...]] = ("cls.", "pooler.", "embeddings.position_ids")

    def __init__(
        self,
        config: ArchConfig,
        quant_config: QuantizationConfig | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        if config.hidden_act not in _ACTIVATIONS:
            raise ValueError(f"config 'hidden_act' {config.hidden_act!r} is not supported by BERT")
        self.config = config
        offset = self.position_offset(config)
        self.embeddings = BertEmbeddings(config, quant_config, dtype, offset)
        self.encoder = BertEncoder(config, quant_config, dtype)

    @classmethod
    def position_offset(cls, config: ArchConfig) -> int:
        """The position-table row of position 0."""
        return 0

    @classmethod
    def max_model_len(cls, config: ArchConfig) -> int:
        """The longest prompt the position table serves."""
        return config.max_position_embeddings - cls.position_offset(config)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # [T], [T], [T] -> [T, hidden]
        return self.encoder(self.embeddings(input_ids, positions, token_type_ids))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load transformers-named tensors (prefixed with `checkpoint_prefix` too);
        ValueError naming missing / unexpected ones. `unused_prefixes` are not read."""
        load_hf_weights(self, self._own_weights(weights), _STACKED_PARAMS, lambda name: False)

    def _own_weights(
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in weights:
            name = name.removeprefix(self.checkpoint_prefix)
            if not name.startswith(self.unused_prefixes):
                yield name, tensor


class BertForMaskedLM(BertModel):
    """A masked-LM BERT checkpoint served as its encoder (its MLM head is not loaded)."""


class BertPooler(nn.Module):
    """transformers' BertPooler on an already pooled hidden state: dense, then tanh."""

    def __init__(self, hidden_size: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size, dtype=dtype)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, hidden]
        return torch.tanh(self.dense(pooled))


class BertForSequenceClassification(BertModel):
    """A BERT cross-encoder or classifier: [CLS]'s last hidden state through BERT's pooler,
    then the classifier to the config's labels (transformers' class of that name)."""

    pooling_tasks: ClassVar[tuple[str, ...]] = ("classify", "score")
    unused_prefixes: ClassVar[tuple[str, ...]] = ("embeddings.position_ids",)

    def __init__(
        self,
        config: ArchConfig,
        quant_config: QuantizationConfig | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__(config, quant_config, dtype)
        self.pooler = BertPooler(config.hidden_size, dtype)
        labels = num_labels(config.hf_config)
        self.classifier = nn.Linear(config.hidden_size, labels, dtype=dtype)

    def classify(self, pooled: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, labels]
        return self.classifier(self.pooler(pooled))
