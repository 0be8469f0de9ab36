"""Qwen2: the Llama decoder with biased q/k/v projections (o_proj has none)."""

from __future__ import annotations

from core.models.arch_config import ArchConfig
from core.models.llama import DecoderOptions, HeadlessDecoder, LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    @classmethod
    def decoder_options(cls, config: ArchConfig) -> DecoderOptions:
        return DecoderOptions(qkv_bias=True, sliding_window=True)


class Qwen2HeadlessModel(HeadlessDecoder, Qwen2ForCausalLM):
    """transformers' Qwen2Model checkpoints."""
