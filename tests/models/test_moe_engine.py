"""Mixtures of experts in the engine: greedy tokens equal transformers' for a batch whose
prompts are prefilled in chunks beside decodes and share a cached prefix, float32."""

from __future__ import annotations

import pytest
from moe_checkpoints import random_moe
from tiny_engine_checkpoint import greedy_reference

from core import LLM, SamplingParams
from core.testing.tiny_checkpoint import VOCAB, write_tiny_checkpoint

WORDS = [VOCAB[f"w{i}"] for i in range(45)]
SHARED = [WORDS[(7 * j + 3) % 45] for j in range(12)]  # three blocks of 4
PROMPTS = [
    SHARED + [WORDS[5], WORDS[9]],
    [WORDS[(3 * j) % 45] for j in range(19)],
    SHARED + [WORDS[30]],
    [WORDS[1], WORDS[2], WORDS[3]],
]
MAX_TOKENS = 8


@pytest.mark.parametrize(
    "architecture",
    ["MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "OlmoeForCausalLM"],
)
def test_greedy_tokens_equal_transformers_through_chunks_and_prefix_hits(architecture, tmp_path):
    hf_model = random_moe(architecture)
    write_tiny_checkpoint(tmp_path, hf_model)
    # An 8-token step budget: the longer prompts are prefilled in chunks beside decodes.
    llm = LLM(str(tmp_path), dtype="float32", max_model_len=64, block_size=4,
              kv_cache_memory="1MiB", max_num_batched_tokens=8)  # fmt: skip
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    try:
        first = llm.generate([PROMPTS[0]], greedy, use_tqdm=False)  # caches the shared prefix
        outputs = llm.generate(PROMPTS[1:], greedy, use_tqdm=False)
    finally:
        llm.engine.shutdown()
    got = [o.outputs[0].token_ids for o in [*first, *outputs]]
    assert got == [greedy_reference(hf_model, prompt, MAX_TOKENS) for prompt in PROMPTS]
    assert outputs[1].num_cached_tokens == 12  # the shared prefix's three blocks
