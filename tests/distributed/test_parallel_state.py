"""Process-group state inside one process: the world of one, the TP stand-in, bad sizes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from core.distributed import parallel_state as ps


def test_without_torch_distributed_groups_have_one_rank_and_collectives_are_identity():
    assert not dist.is_initialized()
    t = torch.tensor([[1.0, 2.0], [3.0, 4.0]])

    for group in (ps.get_world_group(), ps.get_tp_group(), ps.get_pp_group(), ps.get_dp_group()):
        assert (group.world_size, group.rank_in_group, group.ranks) == (1, 0, [0])
        assert group.is_first_rank and group.is_last_rank
        assert group.next_rank == group.prev_rank == 0
        assert group.all_reduce(t) is t
        assert group.all_gather(t, dim=0) is t
        assert group.gather(t, dst=0, dim=0) is t
        assert group.broadcast(t, src=0) is t
        assert group.broadcast_object({"a": 1}) == {"a": 1}
        group.barrier()
    assert ps.get_tensor_model_parallel_rank() == 0
    assert ps.get_tensor_model_parallel_world_size() == 1
    assert ps.get_pipeline_model_parallel_rank() == 0
    assert ps.get_pipeline_model_parallel_world_size() == 1
    assert not ps.model_parallel_is_initialized()
    assert not dist.is_initialized()


def test_a_single_rank_group_cannot_send_to_itself():
    with pytest.raises(RuntimeError, match="cannot send to or receive from itself"):
        ps.get_pp_group().send_tensor_dict({"x": torch.zeros(1)})


def test_patch_tensor_parallel_answers_the_getters_and_restores_them():
    with ps.patch_tensor_parallel(rank=1, world_size=4) as tp:
        assert ps.get_tensor_model_parallel_rank() == 1
        assert ps.get_tensor_model_parallel_world_size() == 4
        assert ps.get_tp_group() is tp
        assert ps.get_pipeline_model_parallel_world_size() == 1
    assert ps.get_tensor_model_parallel_rank() == 0
    assert ps.get_tensor_model_parallel_world_size() == 1


def test_patched_tensor_parallel_collectives_raise_instead_of_pretending():
    t = torch.ones(2)
    with ps.patch_tensor_parallel(rank=0, world_size=2) as tp:
        for collective in (tp.all_reduce, tp.all_gather, tp.broadcast, tp.gather):
            with pytest.raises(RuntimeError, match="tp group of 2 ranks has no process group"):
                collective(t)
        with pytest.raises(RuntimeError, match="has no process group"):
            tp.broadcast_object("x")
        with pytest.raises(RuntimeError, match="has no process group"):
            tp.barrier()


def test_patch_tensor_parallel_refuses_a_rank_outside_the_group():
    with pytest.raises(ValueError, match=r"rank 2 is not in the tp group \[0, 1\]"):
        with ps.patch_tensor_parallel(rank=2, world_size=2):
            pass


def test_model_parallel_needs_the_distributed_environment_first():
    with pytest.raises(RuntimeError, match="init_distributed_environment must run"):
        ps.initialize_model_parallel()


def test_sizes_not_covering_the_world_are_a_value_error_naming_the_flags(tmp_path: Path):
    ps.init_distributed_environment(1, 0, f"file://{tmp_path / 'store'}")
    try:
        with pytest.raises(ValueError) as error:
            ps.initialize_model_parallel(tensor_parallel_size=2)
        assert str(error.value) == (
            "--tensor-parallel-size 2 x --pipeline-parallel-size 1 x --data-parallel-size 1"
            " = 2 ranks, but the world has 1"
        )
        assert not ps.model_parallel_is_initialized()
        with pytest.raises(RuntimeError, match="tp group is not initialised"):
            ps.get_tp_group()

        ps.initialize_model_parallel()
        assert ps.get_tp_group().ranks == ps.get_pp_group().ranks == [0]
        with pytest.raises(RuntimeError, match="exist already"):
            ps.initialize_model_parallel()
    finally:
        ps.destroy_distributed_environment()
    assert not dist.is_initialized()
    assert not ps.model_parallel_is_initialized()
