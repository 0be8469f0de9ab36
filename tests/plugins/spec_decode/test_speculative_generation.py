"""Speculative decoding end to end: the engine's outputs with drafts are those without.

A 4-layer random llama is the target; its drafts come from prompt lookup (ngram), the
target itself loaded again as a draft model (every draft accepted), a 2-layer truncation
of it (a draft model that is often wrong) and the target's first layer (layer_skip). The
batch mixes prompt lengths, shares prefixes (prefix-cache hits) and runs in a KV cache too
small for all of it at once (preemptions), and the tests check that all three happened.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
import transformers
from tiny_engine_checkpoint import VOCAB, reference_model, write_tiny_checkpoint

from core import LLM, SamplingParams
from core.scheduler.output import SpecDecodingStats

pytestmark = pytest.mark.slow  # seven small engines, about 30 s

MAX_MODEL_LEN = 96
K = 3


def _target() -> transformers.LlamaForCausalLM:
    config = reference_model().config
    config.num_hidden_layers = 4
    config.max_position_embeddings = 128
    torch.manual_seed(1)
    return transformers.LlamaForCausalLM(config).eval()


def _truncated(model: transformers.LlamaForCausalLM, num_layers: int):
    config = transformers.LlamaConfig(**{**model.config.to_dict(), "num_hidden_layers": num_layers})
    draft = transformers.LlamaForCausalLM(config).eval()
    state = {k: v for k, v in model.state_dict().items() if k in draft.state_dict()}
    draft.load_state_dict(state)
    return draft


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """{"target": dir, "truncated": dir}, both with the tiny word-level tokenizer."""
    target = _target()
    dirs = {}
    for name, model in (("target", target), ("truncated", _truncated(target, 2))):
        directory = write_tiny_checkpoint(tmp_path_factory.mktemp(name))
        model.save_pretrained(directory)
        dirs[name] = directory
    return dirs


def _prompts() -> list[dict]:
    """Prompts of mixed lengths; the first three share a 20-token prefix."""
    rng = random.Random(0)
    words = [VOCAB[f"w{i}"] for i in range(45)]
    shared = [rng.choice(words) for _ in range(20)]
    prompts = [shared + [rng.choice(words) for _ in range(n)] for n in (3, 9, 1)]
    prompts += [[rng.choice(words) for _ in range(n)] for n in (5, 30, 12, 2, 17)]
    return [{"prompt_token_ids": p} for p in prompts]


def _llm(target: Path, speculative_config: dict | None, **kwargs) -> LLM:
    settings = dict(
        dtype="float32",
        max_model_len=MAX_MODEL_LEN,
        kv_cache_memory="160KiB",  # ~10 blocks per group: the batch must preempt
        max_num_batched_tokens=48,  # long prompts are chunked
        seed=0,
    )
    return LLM(str(target), speculative_config=speculative_config, **{**settings, **kwargs})


def _run(llm: LLM, params: SamplingParams) -> list[list[int]]:
    outputs = llm.generate(_prompts(), params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def _stats(llm: LLM):
    return llm.engine.core.scheduler.make_stats()


GREEDY = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)

METHODS = {
    "ngram": lambda dirs: {"method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 3},
    "draft_model_self": lambda dirs: {"method": "draft_model", "model": str(dirs["target"])},
    "draft_model_truncated": lambda dirs: {"model": str(dirs["truncated"])},
    "layer_skip": lambda dirs: {"method": "layer_skip", "num_layers": 1},
}


@pytest.fixture(scope="module")
def greedy_without_speculation(checkpoints) -> list[list[int]]:
    llm = _llm(checkpoints["target"], None)
    tokens = _run(llm, GREEDY)
    stats = _stats(llm)
    # The batch exercises what it claims to: preemption and prefix-cache hits.
    assert stats.num_preemptions > 0 and stats.prefix_cache_hits > 0
    return tokens


@pytest.mark.parametrize("method", list(METHODS))
def test_greedy_output_is_the_same_with_speculation(
    method, checkpoints, greedy_without_speculation
):
    config = {**METHODS[method](checkpoints), "num_speculative_tokens": K}
    llm = _llm(checkpoints["target"], config)
    assert _run(llm, GREEDY) == greedy_without_speculation
    stats = _stats(llm)
    spec: SpecDecodingStats = stats.spec_decoding
    assert stats.num_preemptions > 0 and stats.prefix_cache_hits > 0
    assert spec.num_drafts > 0 and spec.num_draft_tokens > 0
    assert spec.num_accepted_tokens_per_pos[0] >= spec.num_accepted_tokens_per_pos[-1]
    if method == "draft_model_self":
        assert spec.num_accepted_tokens == spec.num_draft_tokens  # the target agrees with itself
    elif method == "draft_model_truncated":
        assert spec.acceptance_rate < 0.9


def test_greedy_logprobs_are_the_targets(checkpoints):
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, logprobs=2)
    plain = _llm(checkpoints["target"], None).generate(_prompts()[:3], params, use_tqdm=False)
    config = {
        "method": "draft_model",
        "model": str(checkpoints["target"]),
        "num_speculative_tokens": K,
    }
    spec = _llm(checkpoints["target"], config).generate(_prompts()[:3], params, use_tqdm=False)
    for a, b in zip(plain, spec, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        for pa, pb in zip(a.outputs[0].logprobs, b.outputs[0].logprobs, strict=True):
            assert pa.keys() == pb.keys()
            for token_id in pa:
                assert pa[token_id].logprob == pytest.approx(pb[token_id].logprob, abs=1e-4)


@pytest.mark.parametrize("method", ["ngram", "draft_model_truncated"])
def test_seeded_sampling_is_reproducible_with_speculation(method, checkpoints):
    config = {**METHODS[method](checkpoints), "num_speculative_tokens": K}
    params = [
        SamplingParams(temperature=1.0, top_p=0.9, seed=100 + i, max_tokens=30, ignore_eos=True)
        for i in range(len(_prompts()))
    ]
    outputs = _llm(checkpoints["target"], config).generate(_prompts(), params, use_tqdm=False)
    first = [list(o.outputs[0].token_ids) for o in outputs]
    # A different batch (reversed order) must not change a seeded request's tokens.
    llm = _llm(checkpoints["target"], config)
    second = llm.generate(_prompts()[::-1], params[::-1], use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in second][::-1] == first
    assert _stats(llm).spec_decoding.num_drafts > 0
    # Deterministic drafts leave a seeded request's randomness as it is without drafts.
    plain = _llm(checkpoints["target"], None).generate(_prompts(), params, use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in plain] == first
