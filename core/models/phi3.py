"""Phi-3 and Phi-4 (Phi-3-mini/medium, Phi-3.5-mini, Phi-4, Phi-4-mini): the Llama decoder
with a sliding window where the config sets one, no biases, and LongRoPE or partial
rotary through the config (core.models.layers.rotary_embedding).

The checkpoints fuse the projections themselves ("qkv_proj", "gate_up_proj"): they are
split back into q/k/v and gate/up before loading, so the fused layers, their
tensor-parallel shares and the LoRA shard names are Llama's.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from core.models.arch_config import ArchConfig
from core.models.hf_weights import FusedCheckpointModule, split_fused_weights
from core.models.llama import DecoderOptions, LlamaForCausalLM


class Phi3ForCausalLM(LlamaForCausalLM):
    @classmethod
    def decoder_options(cls, config: ArchConfig) -> DecoderOptions:
        return DecoderOptions(sliding_window=True)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Llama's loading, after splitting the checkpoint's fused projections."""
        super().load_weights(split_fused_weights(weights, _fused_modules(self.config)))


def _fused_modules(config: ArchConfig) -> tuple[FusedCheckpointModule, ...]:
    """Phi-3's fused checkpoint modules, with the output size of each projection."""
    q_size = config.num_attention_heads * config.head_dim
    kv_size = config.num_key_value_heads * config.head_dim
    inter = config.intermediate_size
    return (
        FusedCheckpointModule(
            "qkv_proj", (("q_proj", q_size), ("k_proj", kv_size), ("v_proj", kv_size))
        ),
        FusedCheckpointModule("gate_up_proj", (("gate_proj", inter), ("up_proj", inter))),
    )
