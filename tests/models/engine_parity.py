"""Greedy parity through the engine: a random transformers model saved as a tiny checkpoint,
run by the engine in float32 with blocks of 4 and an 8-token step budget (the longer
prompts are prefilled in chunks beside decodes), its tokens against the reference's.

The prompts' convention: the first is generated alone and caches its prefix SHARED (three
blocks); the rest go as one batch, whose second (prompts[2]) starts with SHARED too and
hits the cache.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import transformers
from tiny_engine_checkpoint import greedy_reference

from core import LLM, SamplingParams
from core.kv_cache.spec import KVCacheSpec
from core.testing.tiny_checkpoint import VOCAB, write_tiny_checkpoint

WORDS = [VOCAB[f"w{i}"] for i in range(45)]
SHARED = [WORDS[(7 * j + 3) % 45] for j in range(12)]  # three blocks of 4
BLOCK_SIZE = 4

# (model, prompt, n) -> the model's greedy continuation of `prompt`, `n` tokens, eos or not
Reference = Callable[[transformers.PreTrainedModel, list[int], int], list[int]]


@dataclass(frozen=True)
class EngineRun:
    """What one run of the prompts tells: its KV cache groups' specs and blocks, and how
    often the scheduler preempted."""

    kv_cache_specs: list[KVCacheSpec]
    num_gpu_blocks: int
    num_preemptions: int


def assert_greedy_parity(
    hf_model: transformers.PreTrainedModel,
    checkpoint_dir: Path,
    prompts: list[list[int]],
    max_tokens: int,
    reference: Reference = greedy_reference,
    **engine_kwargs: Any,  # LLM keywords: max_model_len, kv_cache_memory...
) -> EngineRun:
    """Assert the engine's greedy tokens for `prompts` equal `reference`'s and the prefix
    hit of prompts[2]; return the run's facts for the caller's own assertions."""
    write_tiny_checkpoint(checkpoint_dir, hf_model)
    llm = LLM(str(checkpoint_dir), dtype="float32", block_size=BLOCK_SIZE,
              max_num_batched_tokens=8, **engine_kwargs)  # fmt: skip
    greedy = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    try:
        engine_core = llm.engine.core
        specs = [manager.spec for manager in engine_core.scheduler.kv.coordinator.managers]
        first = llm.generate([prompts[0]], greedy, use_tqdm=False)  # caches the shared prefix
        outputs = llm.generate(prompts[1:], greedy, use_tqdm=False)
        num_preemptions = engine_core.scheduler.num_preemptions
        run = EngineRun(specs, engine_core.num_gpu_blocks, num_preemptions)
    finally:
        llm.engine.shutdown()
    got = [o.outputs[0].token_ids for o in [*first, *outputs]]
    assert got == [reference(hf_model, prompt, max_tokens) for prompt in prompts]
    assert outputs[1].num_cached_tokens == len(SHARED)  # the shared prefix's three blocks
    return run
