"""Mixtures of experts in the engine: greedy tokens equal transformers' for a batch whose
prompts are prefilled in chunks beside decodes and share a cached prefix, float32."""

from __future__ import annotations

import pytest
from engine_parity import SHARED, WORDS, assert_greedy_parity
from moe_checkpoints import random_moe

PROMPTS = [
    SHARED + [WORDS[5], WORDS[9]],
    [WORDS[(3 * j) % 45] for j in range(19)],
    SHARED + [WORDS[30]],
    [WORDS[1], WORDS[2], WORDS[3]],
]
MAX_TOKENS = 8
ENGINE = dict(max_model_len=64, kv_cache_memory="1MiB")


@pytest.mark.parametrize(
    "architecture",
    ["MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "OlmoeForCausalLM"],
)
def test_greedy_tokens_equal_transformers_through_chunks_and_prefix_hits(architecture, tmp_path):
    assert_greedy_parity(random_moe(architecture), tmp_path, PROMPTS, MAX_TOKENS, **ENGINE)
