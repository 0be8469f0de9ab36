"""Sampling through the engine with drafts follows the target's softmax (chi-square).

The target is the kit's tiny random llama (a vocabulary of 48 tokens); the drafts come
from its first layer saved as a separate draft model, so they are often wrong. Thousands
of requests sample two tokens at temperature 1 from one prompt: the second token is
always verified against a draft (the proposer drafts after the first step), so its
empirical distribution, given the first token, must be the target's softmax after
prompt + first token (computed here by transformers). A rejection sampler that skips the
residual (re-draws from p after a rejection, so a rejected draft can come back) fails
the same test. The engine is seeded, so each run draws the same tokens: no flakiness.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch
import transformers
from core_spec_decode.draft_model import DraftModelProposer
from tiny_engine_checkpoint import write_tiny_checkpoint

from core import SamplingParams
from core.spec_decode.rejection_sampler import StandardRejectionSampler
from core.testing.test_spec_proposer import engine, write_target

pytestmark = pytest.mark.slow  # 3,000 requests through two engines, about 20 s

NUM_REQUESTS = 3000
PROMPT = [5, 9, 17, 30, 12, 9, 17]
SIGNIFICANCE = 1e-3
MIN_GROUP = 100  # first tokens seen fewer times are left out of the test


class SkipsTheResidual(StandardRejectionSampler):
    """Broken on purpose: accepts a draft with probability p(d), as it should, but after a
    rejection draws from p (independently) instead of from p without the draft."""

    def forward(self, logits, metadata, num_draft_tokens, draft_token_ids, draft_probs=None):
        one_hot = torch.nn.functional.one_hot(draft_token_ids, logits.shape[-1]).float()
        return super().forward(logits, metadata, num_draft_tokens, draft_token_ids, one_hot)

    def _recovery_weights(self, target_probs, draft_token_ids, draft_probs):
        return target_probs


@pytest.fixture(autouse=True)
def _always_draft(monkeypatch):
    """The acceptance gate would pause these often-wrong drafts: every token must be
    verified here."""
    monkeypatch.setattr(DraftModelProposer, "min_acceptance_rate", 0.0)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, Path, transformers.LlamaForCausalLM]:
    target = write_target(tmp_path_factory.mktemp("target"))
    reference = transformers.LlamaForCausalLM.from_pretrained(target).eval()
    config = transformers.LlamaConfig(**{**reference.config.to_dict(), "num_hidden_layers": 1})
    draft_model = transformers.LlamaForCausalLM(config).eval()
    state = reference.state_dict()
    draft_model.load_state_dict({k: v for k, v in state.items() if k in draft_model.state_dict()})
    draft = write_tiny_checkpoint(tmp_path_factory.mktemp("draft"), draft_model)
    return target, draft, reference


def sampled_pairs(target: Path, draft: Path) -> list[tuple[int, int]]:
    config = {"model": str(draft), "num_speculative_tokens": 3}
    llm = engine(
        target, config, kv_cache_memory="4MiB", max_num_seqs=128, max_num_batched_tokens=1024
    )
    # Three tokens, so the second step may verify one draft (it could emit two tokens).
    params = SamplingParams(temperature=1.0, max_tokens=3, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": PROMPT}] * NUM_REQUESTS, params, use_tqdm=False)
    spec = llm.engine.core.scheduler.make_stats().spec_decoding
    assert spec.num_drafts >= NUM_REQUESTS  # every second token was verified against drafts
    assert 0.05 < spec.acceptance_rate < 0.95  # drafts are neither always right nor useless
    return [tuple(o.outputs[0].token_ids[:2]) for o in outputs]


def conditional_p_value(pairs: list[tuple[int, int]], reference) -> float:
    """Chi-square p-value of the second tokens against the target's softmax given the
    first, summed over the first tokens seen at least MIN_GROUP times (bins expected
    below 5 merged into one)."""
    statistic, dof = 0.0, 0
    groups = Counter(first for first, _ in pairs)
    for first, count in groups.items():
        if count < MIN_GROUP:
            continue
        with torch.no_grad():
            logits = reference(torch.tensor([[*PROMPT, first]])).logits[0, -1]
        expected = logits.double().softmax(-1) * count  # [V]
        observed = torch.zeros_like(expected)
        for f, second in pairs:
            if f == first:
                observed[second] += 1
        small = expected < 5
        bins_e = torch.cat([expected[~small], expected[small].sum().reshape(1)])
        bins_o = torch.cat([observed[~small], observed[small].sum().reshape(1)])
        keep = bins_e > 0
        statistic += float(((bins_o[keep] - bins_e[keep]) ** 2 / bins_e[keep]).sum())
        dof += int(keep.sum()) - 1
    assert dof > 10, "too few first tokens seen often enough for a test"
    statistic_t = torch.tensor(statistic, dtype=torch.float64)
    return float(
        torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), statistic_t / 2)
    )


def test_sampling_with_drafts_follows_the_target(models):
    target, draft, reference = models
    assert conditional_p_value(sampled_pairs(target, draft), reference) > SIGNIFICANCE


def test_a_sampler_that_skips_the_residual_fails_the_same_test(models, monkeypatch):
    import core.worker.worker as worker

    monkeypatch.setattr(worker, "StandardRejectionSampler", SkipsTheResidual)
    target, draft, reference = models
    assert conditional_p_value(sampled_pairs(target, draft), reference) < SIGNIFICANCE
