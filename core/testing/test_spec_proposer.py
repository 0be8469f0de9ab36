"""Conformance of a speculative-decoding proposer (`--core-conformance=spec_proposer:NAME`).

The Proposer contract (core.spec_decode.interface), in groups:

- Options, for every proposer: the options model refuses a key it does not know, and
  the error names `speculative_config.<key>`.
- Unit checks, for a model-free proposer (`writes_kv_cache` False, no attention layers;
  others are skipped here): built from default options, `propose` returns one list per
  `propose_rows` entry, in order, of at most k Python ints in the vocabulary (token ids
  past a row's `num_tokens` are out-of-vocabulary garbage here, so reading them shows);
  empty `propose_rows` gives []; the same batch gives the same drafts, from the same
  instance or a fresh one; the batch's arrays are left unchanged; it runs no forward.
- Engine runs, for every installed proposer (by entry name), with its method options from
  `--core-conformance-spec-options NAME=JSON`: on a tiny random 4-layer llama (written
  here by transformers) and a batch that mixes prompt lengths, chunked prefills, shared
  prefixes (prefix-cache hits) and more KV than fits (preemptions), greedy outputs with
  speculation are those without, token for token, and drafts were verified; seeded
  sampled outputs are those without speculation too (core's rejection sampler keeps a
  seeded request's randomness whatever its drafts).
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from core.config import EngineConfig, SpeculativeConfig
from core.forward_context import ForwardContext
from core.models.arch_config import ArchConfig
from core.sampling_params import SamplingParams
from core.spec_decode.interface import ProposalBatch, Proposer, ProposerContext
from core.spec_decode.selector import validate_options
from core.testing.plugin import spec_options_of, targets_of
from core.testing.test_model import TINY
from core.testing.tiny_checkpoint import VOCAB as TINY_VOCAB
from core.testing.tiny_checkpoint import reference_model, write_tiny_checkpoint

VOCAB = 16
GARBAGE = VOCAB + 1000  # what lies past a row's num_tokens: never a valid draft


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    targets = targets_of(metafunc.config, "spec_proposer")
    params = [pytest.param((t.value, t.id), id=t.id) for t in targets]
    metafunc.parametrize("proposer_target", params)


@pytest.fixture
def proposer_cls(proposer_target: tuple[type[Proposer], str]) -> type[Proposer]:
    return proposer_target[0]


def speculative_config(method: str, k: int, **options: object) -> SpeculativeConfig:
    return SpeculativeConfig(method=method, num_speculative_tokens=k, options=options)


# -- options: every proposer ---------------------------------------------------------------


def test_options_refuse_an_unknown_key_naming_it(proposer_target) -> None:
    cls, name = proposer_target
    config = speculative_config(name, 2, no_such_key=1)
    with pytest.raises(ValueError, match=r"speculative_config\.no_such_key"):
        validate_options(cls, config)


# -- unit checks: model-free proposers -----------------------------------------------------


def _no_forward(rows: np.ndarray, positions: np.ndarray) -> ForwardContext:
    raise AssertionError("a model-free proposer runs no forward")


def _no_model(path: str, prefix: str) -> tuple[nn.Module, ArchConfig]:
    raise AssertionError("a model-free proposer loads no model")


def _context(device: torch.device) -> ProposerContext:
    """A target that model-free proposers may read the vocabulary of, and never run."""
    tiny = {**TINY, "vocab_size": VOCAB, "rope_theta": 10000.0}
    arch = ArchConfig(architectures=("LlamaForCausalLM",), **tiny)
    return ProposerContext(EngineConfig(), nn.Module(), arch, device, torch.float32, _no_model)


@pytest.fixture
def build(proposer_target, core_conformance_device):
    """`build(k)`: a model-free proposer with default options drafting k tokens; skips
    proposers that run attention layers."""
    cls, name = proposer_target
    if cls.writes_kv_cache:
        pytest.skip(f"{name} runs attention layers (writes_kv_cache): unit checks need none")

    def build(k: int) -> Proposer:
        proposer = cls(speculative_config(name, k), _context(core_conformance_device))
        if proposer.attention_layers():
            pytest.skip(f"{name} owns attention layers: unit checks need a model-free proposer")
        return proposer

    return build


def make_batch(seed: int, k: int, propose_rows: list[int] | None = None) -> ProposalBatch:
    """Eight rows of 1..40 tokens from a 4-token alphabet (so copies abound), GARBAGE past
    each row's end; rows 2 and 5 are not proposed for unless `propose_rows` says so."""
    rng = np.random.default_rng(seed)
    num_rows, width = 8, 48
    num_tokens = rng.integers(1, 41, num_rows)  # [R]
    num_tokens[0] = 1
    token_ids = np.full((num_rows, width), GARBAGE, dtype=np.int64)  # [R, L]
    for row, n in enumerate(num_tokens):
        token_ids[row, :n] = rng.integers(0, 4, n) * 3  # ids 0, 3, 6, 9
    rows = [0, 1, 3, 4, 6, 7] if propose_rows is None else propose_rows
    # A proposed row sampled (all its tokens settled); the others are mid-prefill.
    num_committed_tokens = num_tokens.copy()
    not_proposed = np.setdiff1d(np.arange(num_rows), rows)
    num_committed_tokens[not_proposed] = (num_tokens[not_proposed] + 1) // 2
    return ProposalBatch(
        req_ids=[f"req-{row}" for row in range(num_rows)],
        token_ids=token_ids,
        num_tokens=num_tokens,
        num_computed_tokens=np.maximum(num_committed_tokens - 1, 0),
        num_committed_tokens=num_committed_tokens,
        propose_rows=np.asarray(rows, dtype=np.int64),
        sampling_params=[SamplingParams(temperature=0.0) for _ in range(num_rows)],
        num_speculative_tokens=k,
        forward_context=_no_forward,
    )


@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_one_list_per_proposed_row_of_at_most_k_vocabulary_ids(build, k: int, seed: int) -> None:
    batch = make_batch(seed, k)
    drafts = build(k).propose(batch)
    assert isinstance(drafts, list) and len(drafts) == len(batch.propose_rows)
    for row_drafts in drafts:
        assert isinstance(row_drafts, list) and len(row_drafts) <= k, row_drafts
        assert all(type(token) is int and 0 <= token < VOCAB for token in row_drafts), row_drafts


def test_every_row_may_be_proposed_for(build) -> None:
    batch = make_batch(3, 3, propose_rows=list(range(8)))
    assert len(build(3).propose(batch)) == 8


def test_no_rows_to_propose_for_gives_no_lists(build) -> None:
    assert build(2).propose(make_batch(4, 2, propose_rows=[])) == []


def test_the_same_batch_gives_the_same_drafts(build) -> None:
    proposer = build(3)
    first = proposer.propose(make_batch(5, 3))
    assert proposer.propose(make_batch(5, 3)) == first
    assert build(3).propose(make_batch(5, 3)) == first


def test_the_batch_is_left_unchanged(build) -> None:
    batch = make_batch(6, 4)
    arrays = (
        "token_ids",
        "num_tokens",
        "num_computed_tokens",
        "num_committed_tokens",
        "propose_rows",
    )
    before = {name: getattr(batch, name).copy() for name in arrays}
    build(4).propose(batch)
    for name in arrays:
        np.testing.assert_array_equal(getattr(batch, name), before[name], err_msg=name)


# -- engine runs: every installed proposer -------------------------------------------------

ENGINE_K = 3
ENGINE_MAX_MODEL_LEN = 96
GREEDY = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)


def write_target(directory: Path) -> Path:
    """The target: the tiny checkpoint's vocabulary and tokenizer, 4 random layers."""
    return write_tiny_checkpoint(
        directory, reference_model(num_hidden_layers=4, max_position_embeddings=128, seed=1)
    )


def mixed_prompts() -> list[dict]:
    """Eight token-id prompts of 2..30 tokens; the first three share a 20-token prefix."""
    rng = random.Random(0)
    words = [TINY_VOCAB[f"w{i}"] for i in range(45)]
    shared = [rng.choice(words) for _ in range(20)]
    prompts = [shared + [rng.choice(words) for _ in range(n)] for n in (3, 9, 1)]
    prompts += [[rng.choice(words) for _ in range(n)] for n in (5, 30, 12, 2, 17)]
    return [{"prompt_token_ids": p} for p in prompts]


def engine(target: Path, speculative_config: dict | None, **kwargs: object):
    """An LLM on `target` whose batch of `mixed_prompts` must chunk, hit and preempt."""
    from core import LLM

    settings = dict(
        dtype="float32",
        max_model_len=ENGINE_MAX_MODEL_LEN,
        kv_cache_memory="160KiB",  # about 10 blocks per group: the batch must preempt
        max_num_batched_tokens=48,  # long prompts are chunked
        seed=0,
    )
    return LLM(str(target), speculative_config=speculative_config, **{**settings, **kwargs})


def generate_tokens(llm, params, prompts: list[dict] | None = None) -> list[list[int]]:
    outputs = llm.generate(prompts or mixed_prompts(), params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def engine_stats(llm):
    """The engine core's cumulative SchedulerStats (an in-process engine)."""
    return llm.engine.core.scheduler.make_stats()


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory) -> Path:
    pytest.importorskip("transformers", reason="the kit writes its target with transformers")
    return write_target(tmp_path_factory.mktemp("spec-target"))


@pytest.fixture
def spec_config(proposer_target, target_dir, request) -> dict:
    """The proposer's speculative_config for the engine runs; skips one the engine cannot
    find by name (a module:Attr reference)."""
    from core.plugins import get_registry
    from core.plugins.groups import SPEC_PROPOSERS

    cls, name = proposer_target
    if get_registry().get(SPEC_PROPOSERS, name) is None:
        pytest.skip(f"{name}: the engine finds proposers by entry name; install it as one")
    options = spec_options_of(request.config, name, str(target_dir))
    return {"method": name, "num_speculative_tokens": ENGINE_K, **options}


@pytest.fixture(scope="module")
def greedy_without_speculation(target_dir) -> list[list[int]]:
    llm = engine(target_dir, None)
    tokens = generate_tokens(llm, GREEDY)
    stats = engine_stats(llm)
    assert stats.num_preemptions > 0 and stats.prefix_cache_hits > 0, "the batch is too easy"
    return tokens


def test_greedy_outputs_are_the_same_with_speculation(
    spec_config, target_dir, greedy_without_speculation
) -> None:
    llm = engine(target_dir, spec_config)
    assert generate_tokens(llm, GREEDY) == greedy_without_speculation
    stats = engine_stats(llm)
    assert stats.num_preemptions > 0 and stats.prefix_cache_hits > 0
    assert stats.spec_decoding.num_draft_tokens > 0, "no draft was ever verified"


def test_seeded_outputs_are_the_same_with_speculation(spec_config, target_dir) -> None:
    params = [
        SamplingParams(temperature=1.0, top_p=0.9, seed=100 + i, max_tokens=30, ignore_eos=True)
        for i in range(len(mixed_prompts()))
    ]
    plain = generate_tokens(engine(target_dir, None), params)
    llm = engine(target_dir, spec_config)
    # Reversed, the batch schedules (and preempts) differently: seeds must not care.
    reversed_tokens = generate_tokens(llm, params[::-1], mixed_prompts()[::-1])
    assert reversed_tokens[::-1] == plain
    assert engine_stats(llm).spec_decoding.num_draft_tokens > 0
