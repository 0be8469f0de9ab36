"""Qwen3: the Llama decoder with per-head RMSNorm of queries and keys before RoPE."""

from __future__ import annotations

from core.models.arch_config import ArchConfig
from core.models.llama import DecoderOptions, HeadlessDecoder, LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    @classmethod
    def decoder_options(cls, config: ArchConfig) -> DecoderOptions:
        bias = config.attention_bias
        return DecoderOptions(qkv_bias=bias, o_proj_bias=bias, qk_norm=True, sliding_window=True)


class Qwen3HeadlessModel(HeadlessDecoder, Qwen3ForCausalLM):
    """transformers' Qwen3Model checkpoints (Qwen3-Embedding saved headless)."""
