"""Layer-skip self-drafting: the target's first N layers, its final norm and lm_head.

No second model: the draft shares the target's weights and its KV cache. The first N
layers' KV of a token depends only on the tokens up to it, so the target's cache already
holds what the draft needs for every computed position, and what the draft writes past
them (the new token, its drafts) the target's next forward recomputes. Useful for a small
model on a CPU, where no smaller sibling exists to draft with.
"""

from __future__ import annotations

import inspect

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from core.config import SpeculativeConfig
from core.spec_decode.interface import ProposalBatch, ProposerContext
from core_spec_decode.autoregressive import AutoregressiveProposer

__all__ = ["LayerSkipOptions", "LayerSkipProposer"]


class LayerSkipOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    num_layers: int | None = Field(default=None, ge=1)
    """Decoder layers the draft runs; None: a quarter of the target's (at least one)."""


class LayerSkipProposer(AutoregressiveProposer):
    options_model = LayerSkipOptions

    def __init__(self, config: SpeculativeConfig, context: ProposerContext) -> None:
        super().__init__(config, context)
        options = LayerSkipOptions.model_validate(config.options)
        total = context.target_arch.num_hidden_layers
        self.num_layers = options.num_layers or max(1, total // 4)
        if self.num_layers >= total:
            raise ValueError(
                f"speculative_config.num_layers must be below the target's {total} layers, "
                f"got {self.num_layers}"
            )
        if "num_layers" not in inspect.signature(context.target_model.forward).parameters:
            raise ValueError(
                "speculative_config.method layer_skip: "
                f"{type(context.target_model).__name__} cannot run only its first layers "
                "(its forward takes no num_layers)"
            )

    def catch_up_starts(self, batch: ProposalBatch) -> np.ndarray:
        # Only the newest token of a proposing row: the target computed everything before.
        starts = batch.num_committed_tokens.copy()
        starts[batch.propose_rows] -= 1
        return starts

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        model = self.context.target_model
        return model.compute_logits(model(input_ids, positions, num_layers=self.num_layers))
