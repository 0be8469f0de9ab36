"""Experts spanning data-parallel engines, at the layer: four gloo processes, two engines
(DP=2) of two tensor-parallel ranks each, every rank holding 2 of the 8 experts whole.

Each engine feeds its own tokens (both of its TP ranks the same ones; an engine may have
none), and every rank's FusedMoE output must equal the single-process reference over
that engine's tokens: the all-to-all dispatch and combine, the TP slices and their
gather together. EPLB's counts, summed over the group, must equal the reference's
routing of every engine's tokens. The ranks run once for the module, pickling what they
computed; the tests compare it with references computed here.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
from spawned_ranks import run_ranks

from core.distributed import parallel_state as ps
from core.models.arch_config import MoEConfig
from core.models.layers.fused_moe import FusedMoE, select_experts
from core.ops.fused_moe import fused_moe_reference

TP, DP = 2, 2
HIDDEN, INTER, EXPERTS = 16, 12, 8
DEADLINE_S = 120.0

# name -> (top_k, tokens of engine 0, tokens of engine 1, every token to expert 5)
SCENARIOS = {
    "uneven engines, odd slices": (2, 5, 3, False),
    "engine 1 has no tokens": (2, 1, 0, False),
    "engine 0 has no tokens": (1, 0, 4, False),
    "top-8 of 8": (8, 3, 2, False),
    "one expert takes every token": (2, 6, 7, True),
}


def _weights(skewed: bool) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    gate = torch.randn(EXPERTS, HIDDEN, generator=generator) * 0.5
    if skewed:  # tokens are positive: expert 5 scores highest for every one
        gate = torch.zeros(EXPERTS, HIDDEN)
        gate[5] = 1.0
    return {
        "gate": gate,
        "w13": torch.randn(EXPERTS, 2 * INTER, HIDDEN, generator=generator) * HIDDEN**-0.5,
        "w2": torch.randn(EXPERTS, HIDDEN, INTER, generator=generator) * INTER**-0.5,
    }


def _tokens(engine: int, count: int, skewed: bool) -> torch.Tensor:
    x = torch.randn(count, HIDDEN, generator=torch.Generator().manual_seed(100 + engine))
    return x.abs() + 0.1 if skewed else x


def _layer(top_k: int, weights: dict[str, torch.Tensor]) -> FusedMoE:
    moe = MoEConfig(num_experts=EXPERTS, top_k=top_k, intermediate_size=INTER)
    layer = FusedMoE(moe, HIDDEN, renormalize=True, prefix="mlp", dtype=torch.float32)
    layer.gate.weight.data.copy_(weights["gate"])
    for name in ("w13", "w2"):
        param = getattr(layer.experts, f"{name}_weight")
        param.weight_loader(param, weights[name], None)  # every expert's, stacked
    return layer


def _run_rank(rank: int, store: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    ps.init_distributed_environment(TP * DP, rank, f"file://{store}")
    seen: dict[str, Any] = {}
    try:
        ps.initialize_model_parallel(
            tensor_parallel_size=TP, data_parallel_size=DP, expert_parallel=True
        )
        engine = rank // TP
        seen["ep_ranks"] = ps.get_ep_group().ranks
        for name, (top_k, *counts, skewed) in SCENARIOS.items():
            layer = _layer(top_k, _weights(skewed))
            layer.pending_load = torch.zeros(EXPERTS)
            out = layer(_tokens(engine, counts[engine], skewed))
            loads = ps.get_ep_group().all_reduce(layer.pending_load)
            seen[name] = {"out": out, "loads": loads, "experts": layer.placement.local_experts()}
    finally:
        ps.destroy_distributed_environment()
    (Path(out_dir) / f"rank{rank}.pkl").write_bytes(pickle.dumps(seen))


@pytest.fixture(scope="module")
def seen(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """What each of the four ranks computed, by global rank (engine = rank // TP)."""
    tmp = tmp_path_factory.mktemp("expert_exchange")
    run_ranks(_run_rank, (str(tmp / "store"), str(tmp)), TP * DP, DEADLINE_S)
    return [pickle.loads((tmp / f"rank{rank}.pkl").read_bytes()) for rank in range(TP * DP)]


def _reference(top_k: int, weights: dict[str, torch.Tensor], x: torch.Tensor):
    weights_k, ids = select_experts(x @ weights["gate"].T, top_k, renormalize=True)
    return fused_moe_reference(x, weights["w13"], weights["w2"], weights_k, ids), ids


def test_every_rank_of_both_engines_is_in_one_expert_group_holding_its_own_experts(seen):
    assert [s["ep_ranks"] for s in seen] == [[0, 1, 2, 3]] * 4
    name = next(iter(SCENARIOS))
    assert [s[name]["experts"] for s in seen] == [[0, 1], [2, 3], [4, 5], [6, 7]]


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_each_engine_gets_its_own_tokens_through_every_ranks_experts(seen, name):
    top_k, *counts, skewed = SCENARIOS[name]
    weights = _weights(skewed)
    for rank, s in enumerate(seen):
        engine = rank // TP
        expected, _ = _reference(top_k, weights, _tokens(engine, counts[engine], skewed))
        torch.testing.assert_close(s[name]["out"], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_eplb_counts_summed_over_the_group_are_every_engines_routing(seen, name):
    top_k, *counts, skewed = SCENARIOS[name]
    weights = _weights(skewed)
    routed = torch.cat(
        [_reference(top_k, weights, _tokens(e, counts[e], skewed))[1].flatten() for e in range(DP)]
    )
    expected = torch.bincount(routed, minlength=EXPERTS).float()
    for s in seen:
        torch.testing.assert_close(s[name]["loads"], expected)
    if skewed:
        assert expected[5] == counts[0] + counts[1]  # every token chose expert 5
