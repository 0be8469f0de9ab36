"""Gemma 3 (text): Gemma 2's decoder with per-head norms of queries and keys, no
soft-capping, five sliding layers to one full, and a RoPE base of their own for the
sliding layers (`rope_local_base_freq`) beside the full layers' scaled one."""

from __future__ import annotations

from dataclasses import replace

from core.models.arch_config import ArchConfig
from core.models.gemma2 import Gemma2ForCausalLM
from core.models.llama import DecoderOptions

__all__ = ["Gemma3ForCausalLM"]

# transformers' RoPE base of the sliding layers when the config names none.
_DEFAULT_LOCAL_ROPE_THETA = 10_000.0


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    """transformers' Gemma3ForCausalLM (the text-only model, config `gemma3_text`); its
    soft caps are whatever the config says (none in the released checkpoints)."""

    @classmethod
    def decoder_options(cls, config: ArchConfig) -> DecoderOptions:
        local_theta = config.rope_local_theta or _DEFAULT_LOCAL_ROPE_THETA
        options = super().decoder_options(config)
        return replace(options, qk_norm=True, local_rope_theta=local_theta)
