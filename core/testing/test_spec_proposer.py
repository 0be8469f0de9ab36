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
"""

from __future__ import annotations

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
from core.testing.plugin import targets_of

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
    arch = ArchConfig(
        architectures=("LlamaForCausalLM",),
        vocab_size=VOCAB,
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=4,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        max_position_embeddings=256,
    )
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
