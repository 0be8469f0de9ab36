"""CudaPlatform without a GPU: its declared components and its device-id namespaces under
CUDA_VISIBLE_DEVICES, including ids Ray assigns."""

from __future__ import annotations

import pytest
import torch
from core_cuda.platform import CudaPlatform


@pytest.fixture
def platform(monkeypatch) -> CudaPlatform:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return CudaPlatform()


def test_cuda_prefers_flash_attention_then_the_reference_over_nccl(platform):
    assert platform.preferred_attention_backends == ("flash", "torch_ref")
    assert platform.dist_backend == "nccl"
    assert platform.memory_profiling and platform.pin_memory


def test_without_the_variable_local_ranks_are_device_ids(platform):
    assert platform.torch_device(1) == torch.device("cuda", 1)
    assert platform.logical_to_physical(1) == 1


def test_visible_devices_map_local_ranks_to_physical_gpus(platform, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert [platform.logical_to_physical(rank) for rank in (0, 1)] == [2, 3]
    # torch numbers the visible GPUs from 0.
    assert [platform.torch_device(rank) for rank in (0, 1)] == [
        torch.device("cuda", 0),
        torch.device("cuda", 1),
    ]


def test_a_ray_actor_computes_on_its_assigned_gpu(platform, monkeypatch):
    # Ray gives an actor of one GPU that GPU's id and narrows CUDA_VISIBLE_DEVICES to it.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    platform.set_assigned_physical_ids((3,))
    assert platform.logical_to_physical(0) == 3
    assert platform.torch_device(0) == torch.device("cuda", 0)


def test_assigned_ids_index_an_unnarrowed_visible_list(platform, monkeypatch):
    # RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES: the actor sees every GPU.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    platform.set_assigned_physical_ids((3,))
    assert platform.torch_device(0) == torch.device("cuda", 1)


def test_an_assigned_gpu_the_variable_hides_is_an_error(platform, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    platform.set_assigned_physical_ids((5,))
    with pytest.raises(RuntimeError, match=r"physical device 5 is not in CUDA_VISIBLE_DEVICES"):
        platform.torch_device(0)
