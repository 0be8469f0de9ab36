"""Gemma 3 (text): Gemma 2's decoder with per-head norms of queries and keys, no
soft-capping, five sliding layers to one full, and a RoPE base of their own for the
sliding layers (`rope_local_base_freq`) beside the full layers' scaled one."""

from __future__ import annotations

from typing import ClassVar

from core.models.gemma2 import Gemma2ForCausalLM, GemmaOptions

__all__ = ["Gemma3ForCausalLM"]


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    """transformers' Gemma3ForCausalLM (the text-only model, config `gemma3_text`); its
    soft caps are whatever the config says (none in the released checkpoints)."""

    # 10,000: transformers' local base when the config names none.
    gemma_options: ClassVar[GemmaOptions] = GemmaOptions(qk_norm=True, local_rope_theta=10_000.0)
