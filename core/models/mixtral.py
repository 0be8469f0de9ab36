"""Mixtral: the Mistral decoder whose MLPs are mixtures of experts (top-k of the router's
softmax, renormalized). Its checkpoints name the block `block_sparse_moe` and each
expert's projections w1 (gate), w3 (up), w2 (down)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

import torch

from core.models.arch_config import ArchConfig
from core.models.hf_weights import ExpertParam
from core.models.llama import DecoderOptions, LlamaForCausalLM


class MixtralForCausalLM(LlamaForCausalLM):
    expert_params: ClassVar[tuple[ExpertParam, ...]] = (
        ExpertParam("w13_weight", "w1", 0),
        ExpertParam("w13_weight", "w3", 1),
        ExpertParam("w2_weight", "w2", 0),
    )

    @classmethod
    def decoder_options(cls, config: ArchConfig) -> DecoderOptions:
        return DecoderOptions(sliding_window=True, moe=True, moe_renormalize=True)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """The checkpoint's `block_sparse_moe` is the decoder's `mlp`."""
        super().load_weights(
            (name.replace(".block_sparse_moe.", ".mlp."), tensor) for name, tensor in weights
        )
