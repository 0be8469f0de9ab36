"""Gemma 2, and the decoder Gemma 3 (text) extends: the Llama-family decoder with Gemma's
switches (`DecoderOptions`).

What sets Gemma apart from Llama: its RMSNorm scales by (1 + weight); each layer
normalizes the attention and MLP outputs too (four norms a layer); the embedding is
scaled by sqrt(hidden_size); the MLP gates with GELU (tanh); the attention scale is
`query_pre_attn_scalar ** -0.5`; attention scores and final logits are soft-capped
(c * tanh(x / c)); and layers alternate between a sliding window and full attention, so
their KV caches fall in two groups (`Attention.kv_cache_spec`: SlidingWindowSpec and
FullAttentionSpec), each freeing what its layers no longer see.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from core.models.arch_config import ArchConfig
from core.models.layers import GemmaRMSNorm
from core.models.llama import DecoderOptions, LlamaForCausalLM

__all__ = ["Gemma2ForCausalLM"]


class Gemma2ForCausalLM(LlamaForCausalLM):
    """Gemma 2: soft-capped attention scores and final logits, alternating sliding and
    full layers, tied embeddings. The model-class interface is LlamaForCausalLM's."""

    hidden_act_key: ClassVar[str] = "hidden_activation"

    @classmethod
    def decoder_options(cls, config: ArchConfig) -> DecoderOptions:
        bias = config.attention_bias
        return DecoderOptions(
            qkv_bias=bias,
            o_proj_bias=bias,
            sliding_window=True,
            hidden_act="gelu_pytorch_tanh",
            norm=GemmaRMSNorm,
            sandwich_norms=True,
            scale_embedding=True,
            query_pre_attn_scalar=True,
            soft_cap=True,
            local_rope_theta=config.rope_local_theta,
        )

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden)  # [N, hidden] -> [N, vocab]
        cap = self.config.final_logit_softcapping
        if cap is None:
            return logits
        return torch.tanh(logits / cap) * cap
