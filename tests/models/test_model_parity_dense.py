"""Whole-model parity with transformers, float32, one sequence through a dense attention."""

from __future__ import annotations

import dataclasses

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

NUM_TOKENS = 12
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    # With head_dim 16 the wavelengths run from 6 to ~20000 positions: a context of 64
    # puts frequencies in all three bands (kept, interpolated, divided by the factor).
    "original_max_position_embeddings": 64,
}
PHI3_LONGROPE = {
    "rope_type": "longrope",
    "rope_theta": 10000.0,
    "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5],  # one per rotated frequency
    "long_factor": [1.0, 2.0, 4.0, 8.0, 16.0, 32.0],
}

CASES = {
    "llama-llama3-rope-tied": (
        "LlamaForCausalLM",
        dict(rope_parameters=LLAMA3_ROPE, tie_word_embeddings=True),
    ),
    "mistral-sliding-window": ("MistralForCausalLM", dict(sliding_window=5)),
    "qwen2-qkv-bias": ("Qwen2ForCausalLM", dict(rope_parameters={"rope_theta": 1e6})),
    "qwen2-window-from-layer-1": (
        "Qwen2ForCausalLM",
        dict(use_sliding_window=True, sliding_window=4, max_window_layers=1),
    ),
    "qwen3-qk-norm-bias": ("Qwen3ForCausalLM", dict(attention_bias=True)),
    # Phi-3's default pad id (32000) is outside the tiny vocabulary.
    "phi3-fused-qkv-sliding-window": ("Phi3ForCausalLM", dict(sliding_window=5, pad_token_id=None)),
    # Phi-4-mini's shape: LongRoPE, 12 of 16 dimensions rotated, tied embeddings. The
    # sequence stays inside the original window (the long factors: tests/models/test_phi3.py).
    "phi4-mini-longrope-partial-rotary-tied": (
        "Phi3ForCausalLM",
        dict(
            rope_parameters=PHI3_LONGROPE,
            original_max_position_embeddings=32,
            partial_rotary_factor=0.75,
            tie_word_embeddings=True,
            pad_token_id=None,
        ),
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_logits_match_transformers_at_every_position(case):
    architecture, overrides = CASES[case]
    hf_model = tiny_hf_model(architecture, **overrides)
    input_ids = torch.randint(0, hf_model.config.vocab_size, (NUM_TOKENS,))

    logits = run_logits(our_model(hf_model), input_ids)

    assert logits.shape == (NUM_TOKENS, hf_model.config.vocab_size)
    assert_logits_match(logits, hf_logits(hf_model, input_ids))


def test_tied_model_loads_without_lm_head_weight():
    hf_model = tiny_hf_model("LlamaForCausalLM", tie_word_embeddings=True)
    state = dict(hf_model.state_dict())
    state.pop("lm_head.weight", None)  # safetensors stores a tied matrix once
    model = ARCHITECTURES["LlamaForCausalLM"][2](our_model(hf_model).config)
    model.load_weights(state.items())
    input_ids = torch.arange(NUM_TOKENS)

    assert_logits_match(run_logits(model, input_ids), hf_logits(hf_model, input_ids))


def test_sliding_window_changes_only_positions_beyond_it():
    hf_model = tiny_hf_model("MistralForCausalLM", sliding_window=5)
    windowed = our_model(hf_model)
    full_config = dataclasses.replace(windowed.config, sliding_window=None)
    full = ARCHITECTURES["MistralForCausalLM"][2](full_config)
    full.load_weights(hf_model.state_dict().items())
    input_ids = torch.randint(0, 256, (NUM_TOKENS,))

    with_window, without = run_logits(windowed, input_ids), run_logits(full, input_ids)

    assert torch.equal(with_window[:5], without[:5])
    assert (with_window[5:] - without[5:]).abs().amax(dim=-1).min() > 1e-3
