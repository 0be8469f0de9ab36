"""Mixtures of experts against transformers, float32, one sequence through a dense
attention: Mixtral (renormalized top-2), Qwen2-MoE (shared expert, dense and sparse
layers), Qwen3-MoE (per-head q/k norm, norm_topk_prob) and OLMoE (q/k norms across heads,
clip_qkv), loaded from the stacked tensors transformers 5 keeps in memory and from the
per-expert tensors its checkpoints hold."""

from __future__ import annotations

import pytest
import torch
from model_harness import (
    ARCHITECTURES,
    assert_logits_match,
    hf_logits,
    our_model,
    run_logits,
    tiny_hf_model,
)

from core.model_loader import resolve_model
from core.models import ArchConfig
from core.models.layers.fused_moe import FusedMoE

NUM_TOKENS = 12
EXPERTS = dict(num_experts_per_tok=2, moe_intermediate_size=32)

CASES = {
    "mixtral-top2-of-8": ("MixtralForCausalLM", dict(num_local_experts=8, num_experts_per_tok=2)),
    "qwen2moe-shared-expert-dense-layer-0": (
        "Qwen2MoeForCausalLM",
        dict(num_experts=8, shared_expert_intermediate_size=48, mlp_only_layers=[0], **EXPERTS),
    ),
    "qwen2moe-sparse-step-2": (
        "Qwen2MoeForCausalLM",
        dict(
            num_experts=4,
            shared_expert_intermediate_size=48,
            decoder_sparse_step=2,
            norm_topk_prob=True,
            **EXPERTS,
        ),
    ),  # fmt: skip
    "qwen3moe-norm-topk": (
        "Qwen3MoeForCausalLM",
        dict(num_experts=8, norm_topk_prob=True, **EXPERTS),
    ),
    "qwen3moe-top8-of-8": (
        "Qwen3MoeForCausalLM",
        dict(num_experts=8, num_experts_per_tok=8, moe_intermediate_size=32),
    ),
    "olmoe-clip-qkv": (
        "OlmoeForCausalLM",
        dict(num_experts=8, num_experts_per_tok=2, clip_qkv=0.5),
    ),
    "olmoe-top1": ("OlmoeForCausalLM", dict(num_experts=4, num_experts_per_tok=1)),
}


@pytest.mark.parametrize("case", CASES)
def test_logits_match_transformers_at_every_position(case):
    architecture, overrides = CASES[case]
    hf_model = tiny_hf_model(architecture, **overrides)
    input_ids = torch.randint(0, hf_model.config.vocab_size, (NUM_TOKENS,))

    model = our_model(hf_model)

    assert any(isinstance(m, FusedMoE) for m in model.modules())
    assert_logits_match(run_logits(model, input_ids), hf_logits(hf_model, input_ids))


def test_sparse_layers_follow_the_config_and_the_rest_stay_dense():
    _, overrides = CASES["qwen2moe-shared-expert-dense-layer-0"]
    model = our_model(tiny_hf_model("Qwen2MoeForCausalLM", **overrides))
    sparse = [isinstance(layer.mlp, FusedMoE) for layer in model.model.layers]
    assert sparse == [False, True]


@pytest.mark.parametrize("case", ["mixtral-top2-of-8", "qwen2moe-shared-expert-dense-layer-0"])
def test_a_saved_checkpoint_of_per_expert_tensors_loads_the_same_model(case, tmp_path):
    architecture, overrides = CASES[case]
    hf_model = tiny_hf_model(architecture, **overrides)
    hf_model.save_pretrained(tmp_path)  # one tensor per expert and projection on disk
    checkpoint = resolve_model(str(tmp_path))
    names = [name for name, _ in checkpoint.iter_weights(torch.float32)]
    assert any(".experts.0." in name for name in names)
    config = ArchConfig.from_hf(checkpoint.hf_config)
    model = ARCHITECTURES[architecture][2](config)
    model.load_weights(checkpoint.iter_weights(torch.float32))
    input_ids = torch.randint(0, hf_model.config.vocab_size, (NUM_TOKENS,))

    assert_logits_match(run_logits(model, input_ids), hf_logits(hf_model, input_ids))


def test_a_checkpoint_missing_an_expert_is_refused_naming_it():
    hf_model = tiny_hf_model("MixtralForCausalLM", num_local_experts=4, num_experts_per_tok=2)
    config = ArchConfig.from_hf(hf_model.config.to_dict())
    model = ARCHITECTURES["MixtralForCausalLM"][2](config)
    state = {
        name: t for name, t in hf_model.state_dict().items() if "layers.1.mlp.experts" not in name
    }
    shapes = {"w1": (96, 64), "w3": (96, 64), "w2": (64, 96)}  # [I, H] and [H, I]
    per_expert = {f"model.layers.1.block_sparse_moe.experts.{e}.{w}.weight": torch.zeros(shape)
                  for e in range(3) for w, shape in shapes.items()}  # fmt: skip
    with pytest.raises(ValueError, match="experts.3.w1.weight"):
        model.load_weights([*state.items(), *per_expert.items()])
