"""Qwen2-MoE and Qwen3-MoE: the Qwen2 and Qwen3 decoders whose sparse layers (every
`decoder_sparse_step`-th, but `mlp_only_layers`) are mixtures of experts; Qwen2-MoE adds
a shared expert behind a sigmoid gate. Top-k weights are renormalized where the config's
norm_topk_prob says."""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

from core.models.arch_config import ArchConfig
from core.models.hf_weights import ExpertParam
from core.models.llama import DecoderOptions
from core.models.qwen2 import Qwen2ForCausalLM
from core.models.qwen3 import Qwen3ForCausalLM

# transformers' names of an expert's projections (OLMoE's too).
GATED_EXPERTS = (
    ExpertParam("w13_weight", "gate_proj", 0),
    ExpertParam("w13_weight", "up_proj", 1),
    ExpertParam("w2_weight", "down_proj", 0),
)


def with_experts(options: DecoderOptions, config: ArchConfig) -> DecoderOptions:
    """`options` with the config's sparse layers as mixtures of experts."""
    renormalize = config.moe is not None and config.moe.norm_topk_prob
    return replace(options, moe=True, moe_renormalize=renormalize)


class Qwen2MoeForCausalLM(Qwen2ForCausalLM):
    expert_params: ClassVar[tuple[ExpertParam, ...]] = GATED_EXPERTS

    @classmethod
    def decoder_options(cls, config: ArchConfig) -> DecoderOptions:
        return with_experts(super().decoder_options(config), config)


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    expert_params: ClassVar[tuple[ExpertParam, ...]] = GATED_EXPERTS

    @classmethod
    def decoder_options(cls, config: ArchConfig) -> DecoderOptions:
        return with_experts(super().decoder_options(config), config)
