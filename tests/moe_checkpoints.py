"""Tiny random mixtures of experts in transformers over the engine tests' vocabulary:
Mixtral, Qwen2-MoE (a shared expert), Qwen3-MoE and OLMoE, for greedy parity and
parallelism tests; written with `core.testing.tiny_checkpoint.write_tiny_checkpoint`."""

from __future__ import annotations

import torch
import transformers

from core.testing.tiny_checkpoint import VOCAB

# architecture -> the transformers classes and what differs from the shared settings.
MOE_ARCHITECTURES = {
    "MixtralForCausalLM": (transformers.MixtralConfig, transformers.MixtralForCausalLM,
                           dict(num_local_experts=8, intermediate_size=32)),
    "Qwen2MoeForCausalLM": (transformers.Qwen2MoeConfig, transformers.Qwen2MoeForCausalLM,
                            dict(num_experts=8, moe_intermediate_size=32,
                                 shared_expert_intermediate_size=48, intermediate_size=64)),
    "Qwen3MoeForCausalLM": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM,
                            dict(num_experts=8, moe_intermediate_size=32, norm_topk_prob=True,
                                 intermediate_size=64)),
    "OlmoeForCausalLM": (transformers.OlmoeConfig, transformers.OlmoeForCausalLM,
                         dict(num_experts=8, intermediate_size=32)),
}  # fmt: skip


def random_moe(architecture: str, seed: int = 0, **overrides) -> transformers.PreTrainedModel:
    """A seeded 2-layer model of `architecture`, top-2 of 8 experts, hidden 32, 4 heads
    of 8 (2 KV heads), weights far from uniform logits so greedy choices are clear."""
    config_class, model_class, own = MOE_ARCHITECTURES[architecture]
    config = config_class(
        vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
        num_experts_per_tok=2, bos_token_id=VOCAB["<s>"], eos_token_id=VOCAB["</s>"],
        tie_word_embeddings=False, initializer_range=0.5, architectures=[architecture],
        **{**own, **overrides},
    )  # fmt: skip
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    return model_class(config).eval()


def skew_router(model: transformers.PreTrainedModel, hot: tuple[int, ...] = (0, 1)) -> None:
    """Make every layer's router send every token to the `hot` experts: the embedding
    gives each token a large constant in hidden dimension 0, which survives in the
    residual stream, and the hot experts' router rows read only that dimension."""
    with torch.no_grad():
        model.get_input_embeddings().weight[:, 0] = 20.0
        for name, param in model.named_parameters():
            if name.endswith("mlp.gate.weight") or name.endswith("block_sparse_moe.gate.weight"):
                param[list(hot)] = 0.0
                param[list(hot), 0] = 20.0
