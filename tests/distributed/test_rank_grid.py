"""The DP x PP x TP rank grid, as arithmetic: no processes."""

from __future__ import annotations

import pytest

from core.distributed.parallel_state import RankGrid


def test_eight_ranks_tp2_pp2_dp2_put_tp_neighbours_together():
    grid = RankGrid(tensor_parallel_size=2, pipeline_parallel_size=2, data_parallel_size=2)

    # global rank = (dp * 2 + pp) * 2 + tp
    assert grid.world_size == 8
    assert grid.tp_group_ranks() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert grid.pp_group_ranks() == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert grid.dp_group_ranks() == [[0, 4], [1, 5], [2, 6], [3, 7]]
    # Experts spanning the engines: every (dp, tp) rank of one stage.
    assert grid.ep_group_ranks() == [[0, 1, 4, 5], [2, 3, 6, 7]]


def test_two_ranks_tp2_is_one_tp_group_and_single_rank_pp_and_dp_groups():
    grid = RankGrid(tensor_parallel_size=2)

    assert grid.tp_group_ranks() == [[0, 1]]
    assert grid.pp_group_ranks() == [[0], [1]]
    assert grid.dp_group_ranks() == [[0], [1]]


def test_two_ranks_pp2_is_one_pipeline_of_single_rank_tp_groups():
    grid = RankGrid(pipeline_parallel_size=2)

    assert grid.tp_group_ranks() == [[0], [1]]
    assert grid.pp_group_ranks() == [[0, 1]]
    assert grid.dp_group_ranks() == [[0], [1]]


def test_pp2_dp3_orders_stages_within_each_replica():
    grid = RankGrid(pipeline_parallel_size=2, data_parallel_size=3)

    assert grid.pp_group_ranks() == [[0, 1], [2, 3], [4, 5]]
    assert grid.dp_group_ranks() == [[0, 2, 4], [1, 3, 5]]


def test_world_size_mismatch_names_every_flag():
    grid = RankGrid(tensor_parallel_size=2, pipeline_parallel_size=2)

    grid.require_world_size(4)
    with pytest.raises(ValueError) as error:
        grid.require_world_size(2)
    assert str(error.value) == (
        "--tensor-parallel-size 2 x --pipeline-parallel-size 2 x --data-parallel-size 1"
        " = 4 ranks, but the world has 2"
    )


@pytest.mark.parametrize(
    ("sizes", "flag"),
    [
        ({"tensor_parallel_size": 0}, "--tensor-parallel-size"),
        ({"pipeline_parallel_size": -1}, "--pipeline-parallel-size"),
        ({"data_parallel_size": 0}, "--data-parallel-size"),
    ],
)
def test_sizes_below_one_are_refused_naming_the_flag(sizes, flag):
    with pytest.raises(ValueError, match=f"^{flag} must be at least 1"):
        RankGrid(**sizes)
