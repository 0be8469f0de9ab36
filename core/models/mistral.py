"""Mistral: the Llama decoder with a sliding attention window and no biases."""

from __future__ import annotations

from core.models.arch_config import ArchConfig
from core.models.llama import DecoderOptions, HeadlessDecoder, LlamaForCausalLM


class MistralForCausalLM(LlamaForCausalLM):
    @classmethod
    def decoder_options(cls, config: ArchConfig) -> DecoderOptions:
        return DecoderOptions(sliding_window=True)


class MistralHeadlessModel(HeadlessDecoder, MistralForCausalLM):
    """transformers' MistralModel checkpoints (E5-Mistral)."""
