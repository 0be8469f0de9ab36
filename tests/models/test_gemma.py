"""Gemma 2 and Gemma 3 (text) against transformers, float32: logits at every position
through the paged reference backend, greedy tokens through the engine (chunked prefill,
prefix hits, preemption) with a sliding window shorter than the prompts, the KV cache's
two groups, and the config spellings of both transformers generations."""

from __future__ import annotations

import pytest
import torch
import transformers
from engine_parity import SHARED, WORDS, assert_greedy_parity
from model_harness import assert_logits_match

from core.kv_cache.spec import FullAttentionSpec, SlidingWindowSpec
from core.model_loader.safetensors_loader import load_safetensors_checkpoint
from core.models import ArchConfig
from core.models.arch_config import FULL_ATTENTION, SLIDING_ATTENTION
from core.models.gemma2 import Gemma2ForCausalLM
from core.models.gemma3 import Gemma3ForCausalLM
from core.testing.test_model import run_paged
from core.testing.tiny_checkpoint import VOCAB

WINDOW = 8
GEMMA3_ROPE = {  # the full layers' base and linear scaling differ from the sliding ones'
    FULL_ATTENTION: {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
    SLIDING_ATTENTION: {"rope_type": "default", "rope_theta": 1e4},
}
# architecture -> the transformers classes, ours, and what differs from the shared settings
GEMMA = {
    "Gemma2ForCausalLM": (transformers.Gemma2Config, transformers.Gemma2ForCausalLM,
                          Gemma2ForCausalLM,
                          # caps small enough to bend these scores and logits
                          dict(attn_logit_softcapping=2.0, final_logit_softcapping=5.0)),
    "Gemma3ForCausalLM": (transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM,
                          Gemma3ForCausalLM, dict(rope_parameters=GEMMA3_ROPE)),
}  # fmt: skip


def random_gemma(architecture: str, **overrides) -> transformers.PreTrainedModel:
    """A seeded model over the engine tests' vocabulary: 2 layers (sliding, then full),
    hidden 32, 4 heads of 16 (2 KV heads), tied embeddings, eager attention."""
    config_class, model_class, _, own = GEMMA[architecture]
    settings = dict(
        vocab_size=len(VOCAB), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
        query_pre_attn_scalar=24, sliding_window=WINDOW, rms_norm_eps=1e-6,
        layer_types=[SLIDING_ATTENTION, FULL_ATTENTION], initializer_range=0.3,
        pad_token_id=VOCAB["<unk>"], bos_token_id=VOCAB["<s>"], eos_token_id=VOCAB["</s>"],
        architectures=[architecture],
    )  # fmt: skip
    config = config_class(**{**settings, **own, **overrides})
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = model_class(config).eval()
    with torch.no_grad():
        for param in model.parameters():  # Gemma's norms start at 0 (a scale of 1)
            param.add_(torch.randn_like(param) * 0.1)
    return model


@pytest.mark.parametrize("architecture", GEMMA)
def test_logits_match_transformers_at_every_position(architecture, tmp_path):
    # A window of 5 over run_paged's 14 tokens: two prompt chunks, then decodes.
    hf_model = random_gemma(architecture, sliding_window=5)
    hf_model.save_pretrained(tmp_path)
    checkpoint = load_safetensors_checkpoint(tmp_path)
    model = GEMMA[architecture][2](ArchConfig.from_hf(checkpoint.hf_config))
    model.load_weights(checkpoint.iter_weights(torch.float32))
    input_ids = torch.randint(0, len(VOCAB), (14,), generator=torch.Generator().manual_seed(0))

    got = run_paged(model, input_ids)

    with torch.inference_mode():
        assert_logits_match(got, hf_model(input_ids[None]).logits[0])


PROMPTS = [  # past the window of 8, so the sliding layer drops blocks
    SHARED + [WORDS[(5 * j) % 45] for j in range(8)],
    [WORDS[(3 * j) % 45] for j in range(19)],
    SHARED + [WORDS[(11 * j + 1) % 45] for j in range(9)],
    [WORDS[(13 * j + 2) % 45] for j in range(21)],
    [WORDS[(17 * j + 4) % 45] for j in range(18)],
]
MAX_TOKENS = 8
# 16 blocks of 4 per group hold fewer than the batch needs, so requests are preempted.
ENGINE = dict(max_model_len=48, kv_cache_memory="32KiB")


@pytest.mark.parametrize("architecture", GEMMA)
def test_greedy_tokens_equal_transformers_through_chunks_prefix_hits_and_preemption(
    architecture, tmp_path
):
    run = assert_greedy_parity(random_gemma(architecture), tmp_path, PROMPTS, MAX_TOKENS, **ENGINE)
    layer = dict(block_size=4, num_kv_heads=2, head_size=16, dtype=torch.float32)
    # Two groups, in layer order: the sliding layer frees what its window no longer sees.
    assert run.kv_cache_specs == [
        SlidingWindowSpec(sliding_window=WINDOW, **layer),
        FullAttentionSpec(**layer),
    ]
    assert run.num_preemptions > 0


BASE = dict(architectures=["Gemma3ForCausalLM"], vocab_size=8, hidden_size=8,
            intermediate_size=8, num_attention_heads=1, rms_norm_eps=1e-6,
            max_position_embeddings=8, sliding_window=4)  # fmt: skip


def test_transformers_4_spelling_pattern_and_local_rope_base():
    config = ArchConfig.from_hf({
        **BASE, "model_type": "gemma3_text", "num_hidden_layers": 7, "sliding_window_pattern": 6,
        "hidden_act": "gelu", "hidden_activation": "gelu_pytorch_tanh",
        "rope_theta": 1e6, "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        "rope_local_base_freq": 1e4, "query_pre_attn_scalar": 24,
    })  # fmt: skip
    assert config.layer_types == (SLIDING_ATTENTION,) * 5 + (FULL_ATTENTION, SLIDING_ATTENTION)
    assert config.hidden_act == "gelu_pytorch_tanh"
    assert (config.rope_theta, config.rope_scaling) == (1e6, {"rope_type": "linear", "factor": 8.0})
    assert config.rope_local_theta == 1e4
    assert config.query_pre_attn_scalar == 24


def test_transformers_5_spelling_per_layer_type_rope():
    config = ArchConfig.from_hf({**BASE, "num_hidden_layers": 2, "rope_parameters": GEMMA3_ROPE})
    assert (config.rope_theta, config.rope_scaling) == (1e6, {"rope_type": "linear", "factor": 8.0})
    assert config.rope_local_theta == 1e4


def test_gemma2_layers_alternate_without_layer_types():
    config = ArchConfig.from_hf({**BASE, "model_type": "gemma2", "num_hidden_layers": 4,
                                 "attn_logit_softcapping": 50.0})  # fmt: skip
    assert config.layer_types == (SLIDING_ATTENTION, FULL_ATTENTION) * 2
    assert config.attn_logit_softcapping == 50.0
    assert config.final_logit_softcapping is None


def test_other_activations_are_refused():
    config = ArchConfig.from_hf({**BASE, "num_hidden_layers": 2, "hidden_activation": "silu"})
    with pytest.raises(ValueError, match="'hidden_activation' 'silu' is not supported"):
        Gemma2ForCausalLM(config)
