"""LoRA with speculative decoding: the target verifies with each request's adapter, so
greedy outputs are those without speculation, whatever drafts them (prompt lookup, the
target's first layer with its adapter, or a draft model without adapters)."""

from __future__ import annotations

import pytest

from core import LLM, LoRARequest, SamplingParams
from core.testing.lora_adapters import AdapterSpec, write_adapter
from core.testing.tiny_checkpoint import VOCAB, reference_model, write_tiny_checkpoint

pytestmark = pytest.mark.slow  # four small engines, about 10 s

PARAMS = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
WORDS = [VOCAB[f"w{i}"] for i in range(5)]  # few words: repetitive prompts, ngram drafts hit
PROMPTS = [[WORDS[(7 * i + j) % 5] for j in range(20)] for i in range(6)]


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("spec-lora")
    base = reference_model(num_hidden_layers=4, max_position_embeddings=128, seed=1)
    write_tiny_checkpoint(root / "base", base)
    spec = AdapterSpec(rank=8, alpha=16, targets=("q_proj", "v_proj", "down_proj"), seed=3)
    write_adapter(root / "adapter", base, spec)
    lora = LoRARequest("adapter", 1, str(root / "adapter"))
    return {"root": root, "loras": [lora, None, lora, None, lora, lora]}


def generate(setup: dict, loras=None, **engine_args) -> tuple[list[list[int]], LLM]:
    llm = LLM(
        str(setup["root"] / "base"),
        dtype="float32",
        max_model_len=128,
        kv_cache_memory="4MiB",
        enable_lora=True,
        **engine_args,
    )
    loras = setup["loras"] if loras is None else loras
    outputs = llm.generate(PROMPTS, PARAMS, use_tqdm=False, lora_request=loras)
    return [o.outputs[0].token_ids for o in outputs], llm


@pytest.fixture(scope="module")
def without_speculation(setup) -> list[list[int]]:
    tokens, _ = generate(setup)
    base, _ = generate(setup, loras=[None] * len(PROMPTS))
    adapted = [i for i, lora in enumerate(setup["loras"]) if lora is not None]
    assert all(tokens[i] != base[i] for i in adapted)  # the adapter matters here
    return tokens


METHODS = {
    "ngram": lambda root: {"method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 3},
    "layer_skip": lambda root: {"method": "layer_skip", "num_layers": 1},
    "draft_model": lambda root: {"method": "draft_model", "model": str(root / "base")},
}


@pytest.mark.parametrize("method", list(METHODS))
def test_speculation_keeps_each_adapters_greedy_outputs(setup, without_speculation, method):
    config = {**METHODS[method](setup["root"]), "num_speculative_tokens": 2}
    tokens, llm = generate(setup, speculative_config=config)
    assert tokens == without_speculation
    stats = llm.engine.core.scheduler.make_stats().spec_decoding
    assert stats.num_draft_tokens > 0 and stats.num_accepted_tokens > 0
