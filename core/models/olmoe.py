"""OLMoE: a Llama decoder whose MLPs are all mixtures of experts, with an RMSNorm over
all query heads and one over all key heads (one statistic per token) and an optional
clamp of q, k and v (`clip_qkv`)."""

from __future__ import annotations

from typing import ClassVar

from core.distributed.parallel_state import get_tensor_model_parallel_world_size
from core.models.arch_config import ArchConfig
from core.models.hf_weights import ExpertParam
from core.models.llama import DecoderOptions, LlamaForCausalLM
from core.models.qwen_moe import GATED_EXPERTS, with_experts


class OlmoeForCausalLM(LlamaForCausalLM):
    expert_params: ClassVar[tuple[ExpertParam, ...]] = GATED_EXPERTS

    @classmethod
    def decoder_options(cls, config: ArchConfig) -> DecoderOptions:
        bias = config.attention_bias
        options = DecoderOptions(
            qkv_bias=bias, o_proj_bias=bias, qk_norm_across_heads=True, clip_qkv=True
        )
        return with_experts(options, config)

    @classmethod
    def check_supported(cls, config: ArchConfig, options: DecoderOptions) -> None:
        super().check_supported(config, options)
        tp_size = get_tensor_model_parallel_world_size()
        if tp_size > 1:
            # The norms' statistic spans every head: ranks would need to gather them.
            raise ValueError(
                f"--tensor-parallel-size {tp_size}: OLMoE runs on one tensor-parallel rank "
                "for now (its query/key norms span all heads)"
            )
