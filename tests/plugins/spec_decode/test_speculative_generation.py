"""Speculative decoding end to end: the engine's outputs with drafts are those without.

A 4-layer random llama is the target; its drafts come from prompt lookup (ngram), the
target itself loaded again as a draft model (every draft accepted), a 2-layer truncation
of it (a draft model that is often wrong) and the target's first layer (layer_skip). The
batch mixes prompt lengths, shares prefixes (prefix-cache hits) and runs in a KV cache too
small for all of it at once (preemptions), and the tests check that all three happened.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import transformers
from tiny_engine_checkpoint import write_tiny_checkpoint

from core import SamplingParams
from core.scheduler.output import SpecDecodingStats
from core.testing.test_spec_proposer import (
    GREEDY,
    engine,
    engine_stats,
    generate_tokens,
    mixed_prompts,
    write_target,
)

pytestmark = pytest.mark.slow  # a dozen small engines, about 30 s

K = 3


def _truncated(model: transformers.LlamaForCausalLM, num_layers: int):
    config = transformers.LlamaConfig(**{**model.config.to_dict(), "num_hidden_layers": num_layers})
    draft = transformers.LlamaForCausalLM(config).eval()
    state = {k: v for k, v in model.state_dict().items() if k in draft.state_dict()}
    draft.load_state_dict(state)
    return draft


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """{"target": dir, "truncated": dir}: the kit's target and its first two layers."""
    target = write_target(tmp_path_factory.mktemp("target"))
    model = transformers.LlamaForCausalLM.from_pretrained(target).eval()
    truncated = write_tiny_checkpoint(tmp_path_factory.mktemp("truncated"), _truncated(model, 2))
    return {"target": target, "truncated": truncated}


METHODS = {
    "ngram": lambda dirs: {"method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 3},
    "draft_model_self": lambda dirs: {"method": "draft_model", "model": str(dirs["target"])},
    "draft_model_truncated": lambda dirs: {"model": str(dirs["truncated"])},
    "layer_skip": lambda dirs: {"method": "layer_skip", "num_layers": 1},
}


@pytest.fixture(scope="module")
def greedy_without_speculation(checkpoints) -> list[list[int]]:
    llm = engine(checkpoints["target"], None)
    tokens = generate_tokens(llm, GREEDY)
    stats = engine_stats(llm)
    # The batch exercises what it claims to: preemption and prefix-cache hits.
    assert stats.num_preemptions > 0 and stats.prefix_cache_hits > 0
    return tokens


@pytest.mark.parametrize("method", list(METHODS))
def test_greedy_output_is_the_same_with_speculation(
    method, checkpoints, greedy_without_speculation
):
    config = {**METHODS[method](checkpoints), "num_speculative_tokens": K}
    llm = engine(checkpoints["target"], config)
    assert generate_tokens(llm, GREEDY) == greedy_without_speculation
    stats = engine_stats(llm)
    spec: SpecDecodingStats = stats.spec_decoding
    assert stats.num_preemptions > 0 and stats.prefix_cache_hits > 0
    assert spec.num_drafts > 0 and spec.num_draft_tokens > 0
    assert spec.num_accepted_tokens_per_pos[0] >= spec.num_accepted_tokens_per_pos[-1]
    if method.startswith("draft_model"):
        # The draft's layers have a KV-cache group of their own beside the target's.
        groups = llm.engine.core.kv.coordinator.managers
        assert [type(g.spec).__name__ for g in groups] == [
            "FullAttentionSpec",
            "DraftAttentionSpec",
        ]
    if method == "draft_model_self":
        assert spec.num_accepted_tokens == spec.num_draft_tokens  # the target agrees with itself
    elif method == "draft_model_truncated":
        assert spec.acceptance_rate < 0.9


def test_greedy_logprobs_are_the_targets(checkpoints):
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, logprobs=2)
    plain = engine(checkpoints["target"], None).generate(
        mixed_prompts()[:3], params, use_tqdm=False
    )
    config = {
        "method": "draft_model",
        "model": str(checkpoints["target"]),
        "num_speculative_tokens": K,
    }
    spec = engine(checkpoints["target"], config).generate(
        mixed_prompts()[:3], params, use_tqdm=False
    )
    for a, b in zip(plain, spec, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        for pa, pb in zip(a.outputs[0].logprobs, b.outputs[0].logprobs, strict=True):
            assert pa.keys() == pb.keys()
            for token_id in pa:
                assert pa[token_id].logprob == pytest.approx(pb[token_id].logprob, abs=1e-4)


def test_seeded_sampling_is_reproducible_with_a_draft_often_rejected(checkpoints):
    # The kit checks the same with drafts mostly accepted (core.testing.test_spec_proposer).
    config = {**METHODS["draft_model_truncated"](checkpoints), "num_speculative_tokens": K}
    params = [
        SamplingParams(temperature=1.0, top_p=0.9, seed=100 + i, max_tokens=30, ignore_eos=True)
        for i in range(len(mixed_prompts()))
    ]
    outputs = engine(checkpoints["target"], config).generate(
        mixed_prompts(), params, use_tqdm=False
    )
    first = [list(o.outputs[0].token_ids) for o in outputs]
    # A different batch (reversed order) must not change a seeded request's tokens.
    llm = engine(checkpoints["target"], config)
    second = llm.generate(mixed_prompts()[::-1], params[::-1], use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in second][::-1] == first
    assert engine_stats(llm).spec_decoding.num_drafts > 0
    # Deterministic drafts leave a seeded request's randomness as it is without drafts.
    plain = engine(checkpoints["target"], None).generate(mixed_prompts(), params, use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in plain] == first


def test_a_draft_catches_up_a_full_budget_plus_each_new_token(checkpoints):
    # Two 8-token prompts fill a 16-token budget and both sample: the draft's catch-up
    # forward then covers 18 tokens, more than any step of the target.
    prompts = [{"prompt_token_ids": p["prompt_token_ids"][:8]} for p in mixed_prompts()[:2]]
    config = {
        "method": "draft_model",
        "model": str(checkpoints["target"]),
        "num_speculative_tokens": K,
    }
    plain = generate_tokens(engine(checkpoints["target"], None), GREEDY, prompts)
    llm = engine(checkpoints["target"], config, max_num_batched_tokens=16, max_num_seqs=2)
    assert generate_tokens(llm, GREEDY, prompts) == plain
