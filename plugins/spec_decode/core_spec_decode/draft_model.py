"""Draft-model speculation: a smaller model with the target's vocabulary drafts k tokens.

The draft keeps its own KV cache, in a KV-cache group of its own (DraftAttentionSpec), and
is kept in sync by computing every position the step committed (a prefill chunk, the
accepted tokens and the new one) before it drafts; the KV it wrote for rejected drafts
sits past those positions and is overwritten the same way the target's is.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from core.attention.layer import Attention
from core.config import SpeculativeConfig
from core.kv_cache.spec import FullAttentionSpec, KVCacheSpec
from core.model_loader import resolve_model
from core.spec_decode.interface import ProposalBatch, ProposerContext
from core_spec_decode.autoregressive import AutoregressiveProposer

__all__ = ["DraftAttentionSpec", "DraftModelOptions", "DraftModelProposer"]

LAYER_PREFIX = "draft."


@dataclasses.dataclass(frozen=True, kw_only=True)
class DraftAttentionSpec(FullAttentionSpec):
    """A draft model's full-attention layer: its own KV-cache group (never the target's,
    even when the shapes match), managed like full attention (the spec registry walks the
    class's ancestors)."""


class DraftModelOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    """The draft checkpoint: anything core can load, with the target's vocabulary."""

    @field_validator("model")
    @classmethod
    def _exists(cls, model: str) -> str:
        try:
            resolve_model(model)
        except ValueError as exc:
            raise ValueError(f"the draft model cannot be loaded: {exc}") from None
        return model


class DraftModelProposer(AutoregressiveProposer):
    options_model = DraftModelOptions

    def __init__(self, config: SpeculativeConfig, context: ProposerContext) -> None:
        super().__init__(config, context)
        options = DraftModelOptions.model_validate(config.options)
        self.model, arch = context.load_model(options.model, LAYER_PREFIX)
        target_vocab = context.target_arch.vocab_size
        if arch.vocab_size != target_vocab:
            raise ValueError(
                f"speculative_config.model {options.model}: the draft's vocab_size "
                f"{arch.vocab_size} differs from the target's {target_vocab}"
            )

    def attention_layers(self) -> list[Attention]:
        return [m for m in self.model.modules() if isinstance(m, Attention)]

    def kv_cache_spec(self, block_size: int, dtype: torch.dtype) -> dict[str, KVCacheSpec]:
        specs = super().kv_cache_spec(block_size, dtype)
        return {name: _own_group(spec) for name, spec in specs.items()}

    def catch_up_starts(self, batch: ProposalBatch) -> np.ndarray:
        return batch.num_computed_tokens.copy()

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model.compute_logits(self.model(input_ids, positions))


def _own_group(spec: KVCacheSpec) -> KVCacheSpec:
    if type(spec) is not FullAttentionSpec:
        return spec  # a sliding window keeps its own manager (and so its own group)
    return DraftAttentionSpec(**{f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)})
