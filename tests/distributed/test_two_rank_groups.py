"""Two real gloo processes: group layout for TP=2 and PP=2, and every collective.

The two ranks are spawned once for the module; each runs the whole scenario (TP=2 groups,
then PP=2 groups, then teardown) and pickles what it observed, and the tests below check
those observations. The ranks meet through a file:// store in a temporary directory.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
from spawned_ranks import run_ranks

from core.distributed import parallel_state as ps

WORLD_SIZE = 2
DEADLINE_S = 60.0


def _tensor_dict_from(rank: int) -> dict[str, Any]:
    """Intermediate tensors as a pipeline stage would send them, mixed with plain values."""
    return {
        "hidden_states": torch.arange(8.0).reshape(2, 4) * 0.5 + rank,
        "transposed": torch.arange(6).reshape(2, 3).t(),  # not contiguous
        "mask": torch.tensor([True, False, True]),
        "residual": torch.empty(0, 4, dtype=torch.bfloat16),
        "step": 7 + rank,
        "request_ids": ["a", "b"],
    }


def _layout(group: ps.GroupCoordinator) -> dict[str, Any]:
    return {
        "ranks": group.ranks,
        "rank_in_group": group.rank_in_group,
        "first": group.is_first_rank,
        "last": group.is_last_rank,
        "next": group.next_rank,
        "prev": group.prev_rank,
    }


def _tp_scenario(rank: int) -> dict[str, Any]:
    ps.initialize_model_parallel(tensor_parallel_size=WORLD_SIZE)
    tp = ps.get_tp_group()
    block = torch.arange(6.0).reshape(2, 3) + 100 * rank
    seen = {
        "tp": _layout(tp),
        "pp": _layout(ps.get_pp_group()),
        "dp": _layout(ps.get_dp_group()),
        "tp_getters": (
            ps.get_tensor_model_parallel_rank(),
            ps.get_tensor_model_parallel_world_size(),
        ),
        "pp_getters": (
            ps.get_pipeline_model_parallel_rank(),
            ps.get_pipeline_model_parallel_world_size(),
        ),
        "all_reduce": tp.all_reduce(torch.tensor([rank + 1.0, 10.0 * (rank + 1)])),
        "all_gather_last": tp.all_gather(block),
        "all_gather_0": tp.all_gather(block, dim=0),
        "gather_to_1": tp.gather(block, dst=1, dim=0),
        "broadcast_from_1": tp.broadcast(torch.full((3,), float(rank)), src=1),
        "broadcast_object": tp.broadcast_object({"from": rank} if rank == 0 else None),
    }
    # A round trip on the ring: default destination is the next rank, source the previous.
    if rank == 0:
        tp.send_tensor_dict(_tensor_dict_from(rank))
        seen["received"] = tp.recv_tensor_dict()
    else:
        seen["received"] = tp.recv_tensor_dict()
        tp.send_tensor_dict(_tensor_dict_from(rank))
    tp.barrier()
    ps.destroy_model_parallel()
    return seen


def _pp_scenario(rank: int) -> dict[str, Any]:
    ps.initialize_model_parallel(pipeline_parallel_size=WORLD_SIZE)
    pp = ps.get_pp_group()
    seen = {"tp": _layout(ps.get_tp_group()), "pp": _layout(pp), "dp": _layout(ps.get_dp_group())}
    if pp.is_first_rank:
        pp.send_tensor_dict(_tensor_dict_from(rank), dst=1)
    else:
        seen["received"] = pp.recv_tensor_dict(src=0)
    ps.destroy_model_parallel()
    return seen


def _run_rank(rank: int, store: str, out_dir: str) -> None:
    ps.init_distributed_environment(WORLD_SIZE, rank, f"file://{store}")
    try:
        seen = {"world": _layout(ps.get_world_group())}
        seen["tp2"] = _tp_scenario(rank)
        seen["pp2"] = _pp_scenario(rank)
    finally:
        ps.destroy_distributed_environment()
    seen["initialized_after_destroy"] = torch.distributed.is_initialized()
    (Path(out_dir) / f"rank{rank}.pkl").write_bytes(pickle.dumps(seen))


@pytest.fixture(scope="module")
def seen(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """What each rank observed, indexed by global rank."""
    tmp = tmp_path_factory.mktemp("two_ranks")
    run_ranks(_run_rank, (str(tmp / "store"), str(tmp)), WORLD_SIZE, DEADLINE_S)
    return [pickle.loads((tmp / f"rank{rank}.pkl").read_bytes()) for rank in range(WORLD_SIZE)]


def test_world_group_spans_both_ranks(seen):
    assert [s["world"]["ranks"] for s in seen] == [[0, 1], [0, 1]]
    assert [s["world"]["rank_in_group"] for s in seen] == [0, 1]


def test_tp2_makes_one_tp_group_and_single_rank_pp_and_dp_groups(seen):
    assert [s["tp2"]["tp"] for s in seen] == [
        {"ranks": [0, 1], "rank_in_group": 0, "first": True, "last": False, "next": 1, "prev": 1},
        {"ranks": [0, 1], "rank_in_group": 1, "first": False, "last": True, "next": 0, "prev": 0},
    ]
    assert [s["tp2"]["pp"]["ranks"] for s in seen] == [[0], [1]]
    assert [s["tp2"]["dp"]["ranks"] for s in seen] == [[0], [1]]
    assert [s["tp2"]["tp_getters"] for s in seen] == [(0, 2), (1, 2)]
    assert [s["tp2"]["pp_getters"] for s in seen] == [(0, 1), (0, 1)]


def test_pp2_makes_one_pipeline_of_single_rank_tp_groups(seen):
    assert [s["pp2"]["tp"]["ranks"] for s in seen] == [[0], [1]]
    assert [s["pp2"]["dp"]["ranks"] for s in seen] == [[0], [1]]
    assert [(s["pp2"]["pp"]["first"], s["pp2"]["pp"]["last"]) for s in seen] == [
        (True, False),
        (False, True),
    ]
    assert [s["pp2"]["pp"]["ranks"] for s in seen] == [[0, 1], [0, 1]]


def test_all_reduce_sums_over_the_group(seen):
    for s in seen:
        torch.testing.assert_close(s["tp2"]["all_reduce"], torch.tensor([3.0, 30.0]))


def test_all_gather_concatenates_in_rank_order_along_the_dim(seen):
    last = torch.tensor([[0.0, 1, 2, 100, 101, 102], [3, 4, 5, 103, 104, 105]])
    first = torch.tensor([[0.0, 1, 2], [3, 4, 5], [100, 101, 102], [103, 104, 105]])
    for s in seen:
        torch.testing.assert_close(s["tp2"]["all_gather_last"], last)
        torch.testing.assert_close(s["tp2"]["all_gather_0"], first)


def test_gather_concatenates_on_the_destination_only(seen):
    assert seen[0]["tp2"]["gather_to_1"] is None
    expected = torch.tensor([[0.0, 1, 2], [3, 4, 5], [100, 101, 102], [103, 104, 105]])
    torch.testing.assert_close(seen[1]["tp2"]["gather_to_1"], expected)


def test_broadcast_takes_the_source_ranks_tensor_and_object(seen):
    for s in seen:
        torch.testing.assert_close(s["tp2"]["broadcast_from_1"], torch.tensor([1.0, 1.0, 1.0]))
        assert s["tp2"]["broadcast_object"] == {"from": 0}


def _assert_tensor_dict_from(received: dict[str, Any], rank: int) -> None:
    assert list(received) == [
        "hidden_states",
        "transposed",
        "mask",
        "residual",
        "step",
        "request_ids",
    ]
    hidden = torch.tensor([[0.0, 0.5, 1.0, 1.5], [2.0, 2.5, 3.0, 3.5]]) + rank
    torch.testing.assert_close(received["hidden_states"], hidden)
    assert torch.equal(received["transposed"], torch.tensor([[0, 3], [1, 4], [2, 5]]))
    assert torch.equal(received["mask"], torch.tensor([True, False, True]))
    assert received["residual"].shape == (0, 4)
    assert received["residual"].dtype == torch.bfloat16
    assert received["step"] == 7 + rank
    assert received["request_ids"] == ["a", "b"]


def test_tensor_dict_round_trips_on_the_ring_with_default_peers(seen):
    _assert_tensor_dict_from(seen[1]["tp2"]["received"], rank=0)
    _assert_tensor_dict_from(seen[0]["tp2"]["received"], rank=1)


def test_pipeline_stage_hands_its_tensor_dict_to_the_next_stage(seen):
    _assert_tensor_dict_from(seen[1]["pp2"]["received"], rank=0)
    assert "received" not in seen[0]["pp2"]


def test_destroy_leaves_torch_distributed_uninitialised(seen):
    assert [s["initialized_after_destroy"] for s in seen] == [False, False]
