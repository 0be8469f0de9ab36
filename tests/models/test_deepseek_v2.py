"""DeepSeek-V2 against transformers, float32: logits at every position through the paged
reference backends (prompt chunks over cached latents, then decodes), and greedy tokens
through the engine (chunked prefill, prefix hits, preemption) with a KV cache of one
latent per token, on the reference MLA backend and on core-cpu-kernels' (its C++ decode
kernel); its routing and configuration on their own."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import transformers
from deepseek_checkpoints import (
    DEEPSEEK_VARIANTS,
    KV_LORA_RANK,
    NUM_LAYERS,
    QK_ROPE_HEAD_DIM,
    random_deepseek,
)
from engine_parity import BLOCK_SIZE, SHARED, WORDS, assert_greedy_parity
from model_harness import assert_logits_match

from core.kv_cache.spec import MLAAttentionSpec
from core.model_loader.safetensors_loader import load_safetensors_checkpoint
from core.models import ArchConfig
from core.models.arch_config import MoEConfig
from core.models.deepseek_v2 import DeepseekV2ForCausalLM
from core.models.layers.fused_moe import select_experts
from core.testing.test_model import run_paged
from core.testing.tiny_checkpoint import VOCAB

LATENT = KV_LORA_RANK + QK_ROPE_HEAD_DIM


def our_deepseek(hf_model: transformers.PreTrainedModel, tmp_path) -> DeepseekV2ForCausalLM:
    """Ours, loaded from `hf_model` saved as a checkpoint (the names a loader yields)."""
    hf_model.save_pretrained(tmp_path)
    checkpoint = load_safetensors_checkpoint(tmp_path)
    model = DeepseekV2ForCausalLM(ArchConfig.from_hf(checkpoint.hf_config))
    model.load_weights(checkpoint.iter_weights(torch.float32))
    return model


@pytest.mark.parametrize("variant", DEEPSEEK_VARIANTS)
def test_logits_match_transformers_at_every_position(variant, tmp_path):
    hf_model = random_deepseek(variant)
    model = our_deepseek(hf_model, tmp_path)
    input_ids = torch.randint(0, len(VOCAB), (14,), generator=torch.Generator().manual_seed(0))

    got = run_paged(model, input_ids)  # two prompt chunks (the second over cached latents), decodes

    with torch.inference_mode():
        assert_logits_match(got, hf_model(input_ids[None]).logits[0])


PROMPTS = [
    SHARED + [WORDS[5], WORDS[9]],
    [WORDS[(3 * j) % 45] for j in range(19)],
    SHARED + [WORDS[30]],
    [WORDS[(13 * j + 2) % 45] for j in range(17)],
    [WORDS[1], WORDS[2], WORDS[3]],
]
MAX_TOKENS = 8
KV_CACHE_BYTES = 12 * 1024  # 16 blocks of one latent per token and layer
# The cache's blocks hold fewer than the batch needs, so requests are preempted.
ENGINE = dict(max_model_len=48, kv_cache_memory="12KiB")  # KV_CACHE_BYTES


# Forced, cpu_paged serves these layers through its MLA backend or not at all (the
# selector raises): its parity is its C++ decode kernel's.
ATTENTION_BACKENDS = [
    "torch_ref",
    pytest.param(
        "cpu_paged",
        marks=pytest.mark.skipif(
            importlib.util.find_spec("core_cpu_kernels") is None,
            reason="core-cpu-kernels is not installed (optional plugin)",
        ),
    ),
]


@pytest.mark.parametrize("attention_backend", ATTENTION_BACKENDS)
@pytest.mark.parametrize("variant", DEEPSEEK_VARIANTS)
def test_greedy_tokens_equal_transformers_through_chunks_prefix_hits_and_preemption(
    variant, attention_backend, tmp_path
):
    hf_model = random_deepseek(variant)
    run = assert_greedy_parity(hf_model, tmp_path, PROMPTS, MAX_TOKENS,
                               attention_backend=attention_backend, **ENGINE)  # fmt: skip
    # One latent per token and layer: the budget pays for that many float32 values, not
    # for every head's key and value.
    specs = run.kv_cache_specs
    assert specs == [MLAAttentionSpec(block_size=BLOCK_SIZE, head_size=LATENT, dtype=torch.float32)]
    assert specs[0].page_size_bytes == BLOCK_SIZE * LATENT * 4
    assert run.num_gpu_blocks == KV_CACHE_BYTES // (NUM_LAYERS * BLOCK_SIZE * LATENT * 4)
    assert run.num_preemptions > 0


def test_group_limited_routing_matches_transformers():
    hf_model = random_deepseek("lite_grouped_moe")
    router = hf_model.model.layers[1].mlp.gate  # DeepseekV2TopkRouter
    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        _, want_weights, want_ids = router(x)
    config = hf_model.config
    weights, ids = select_experts(
        x @ router.weight.T, config.num_experts_per_tok, False,
        (config.n_group, config.topk_group), config.routed_scaling_factor,
    )  # fmt: skip

    # transformers leaves the top-k unsorted: compare each token's choices in expert order
    order, want_order = ids.argsort(dim=-1), want_ids.argsort(dim=-1)
    assert torch.equal(ids.gather(1, order), want_ids.gather(1, want_order))
    torch.testing.assert_close(weights.gather(1, order), want_weights.gather(1, want_order))
    # The groups limit the choice here: plain top-k picks other experts for some tokens.
    _, ungrouped = select_experts(x @ router.weight.T, config.num_experts_per_tok, False)
    assert not torch.equal(ungrouped.sort(dim=-1).values, ids.sort(dim=-1).values)


def test_sparse_layers_follow_first_k_dense_replace_and_moe_layer_freq():
    moe = MoEConfig.from_hf({"n_routed_experts": 8, "num_experts_per_tok": 2,
                             "moe_intermediate_size": 16, "n_shared_experts": 2,
                             "first_k_dense_replace": 1, "moe_layer_freq": 2})  # fmt: skip
    assert [moe.is_sparse(i) for i in range(5)] == [False, False, True, False, True]
    assert moe.shared_expert_intermediate_size == 32
    assert (moe.n_group, moe.topk_group) == (1, 1)  # greedy: no group limit


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"topk_method": "noaux_tc"}, "'topk_method' 'noaux_tc'"),
        ({"scoring_func": "sigmoid"}, "'scoring_func' 'sigmoid'"),
        ({"topk_method": "group_limited_greedy", "n_group": 3, "topk_group": 1}, "do not fit"),
    ],
)
def test_unsupported_routing_is_refused(settings, message):
    config = {"n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 16}
    with pytest.raises(ValueError, match=message):
        MoEConfig.from_hf({**config, **settings})
