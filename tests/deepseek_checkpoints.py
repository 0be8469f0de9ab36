"""Tiny random DeepSeek-V2 models in transformers over the engine tests' vocabulary:
multi-head latent attention with or without a query bottleneck, and mixtures of experts
with shared experts and (group-limited) routing, for parity tests; written with
`core.testing.tiny_checkpoint.write_tiny_checkpoint`."""

from __future__ import annotations

import torch
import transformers

from core.testing.tiny_checkpoint import VOCAB

NUM_LAYERS = 2
# variant -> what differs from the shared settings
DEEPSEEK_VARIANTS = {
    # V2-Lite's shape: a plain q_proj, a dense first layer, then experts picked within the
    # better of 2 groups of 4, with shared experts and a routing scale.
    "lite_grouped_moe": dict(q_lora_rank=None, first_k_dense_replace=1,
                             topk_method="group_limited_greedy", n_group=2, topk_group=1,
                             routed_scaling_factor=1.5),
    # V2's query bottleneck, every layer sparse, plain top-k.
    "q_lora_greedy_moe": dict(q_lora_rank=24, first_k_dense_replace=0, topk_method="greedy"),
    "dense": dict(q_lora_rank=None, first_k_dense_replace=NUM_LAYERS),
    # V2-Lite's YaRN: a context stretched 4 times, mscale and mscale_all_dim unequal so
    # that both the cos/sin and the softmax scale change.
    "lite_yarn": dict(q_lora_rank=None, first_k_dense_replace=1,
                      rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                           original_max_position_embeddings=16, beta_fast=32,
                                           beta_slow=1, mscale=1.0, mscale_all_dim=0.8)),
}  # fmt: skip
KV_LORA_RANK, QK_ROPE_HEAD_DIM = 16, 8  # the cached latent: 24 values per token


def random_deepseek(variant: str, seed: int = 0, **overrides) -> transformers.PreTrainedModel:
    """A seeded 2-layer DeepSeek-V2 of `variant`: hidden 32, 4 heads with query/key of
    8 plain + 8 rotary dimensions and values of 12, a latent of 16 + 8, top-2 of 8
    experts of width 16 and 2 shared ones; every parameter perturbed (norms included)
    so that greedy choices are clear and nothing is left at its initial value."""
    config = transformers.DeepseekV2Config(
        vocab_size=len(VOCAB), hidden_size=32, intermediate_size=48, num_hidden_layers=NUM_LAYERS,
        num_attention_heads=4, kv_lora_rank=KV_LORA_RANK, qk_nope_head_dim=8,
        qk_rope_head_dim=QK_ROPE_HEAD_DIM, v_head_dim=12, n_routed_experts=8,
        num_experts_per_tok=2, moe_intermediate_size=16, n_shared_experts=2,
        max_position_embeddings=64, bos_token_id=VOCAB["<s>"], eos_token_id=VOCAB["</s>"],
        tie_word_embeddings=False, initializer_range=0.5, architectures=["DeepseekV2ForCausalLM"],
        **{**DEEPSEEK_VARIANTS[variant], **overrides},
    )  # fmt: skip
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.DeepseekV2ForCausalLM(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.1)
    return model
