"""RocmPlatform without a GPU: its declared components and its device-id namespaces under
HIP_VISIBLE_DEVICES, including ids Ray assigns."""

from __future__ import annotations

import pytest
import torch
from core_rocm.platform import RocmPlatform


@pytest.fixture
def platform(monkeypatch) -> RocmPlatform:
    monkeypatch.delenv("HIP_VISIBLE_DEVICES", raising=False)
    return RocmPlatform()


def test_rocm_prefers_flash_attention_then_the_reference_over_rccl(platform):
    assert platform.preferred_attention_backends == ("flash", "torch_ref")
    assert platform.dist_backend == "nccl"  # RCCL answers to torch's nccl backend
    assert platform.device_type == "cuda"  # HIP devices are torch's cuda devices
    assert platform.memory_profiling and platform.pin_memory


def test_hip_visible_devices_map_local_ranks_to_physical_gpus(platform, monkeypatch):
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "4,6")
    assert [platform.logical_to_physical(rank) for rank in (0, 1)] == [4, 6]
    assert platform.torch_device(1) == torch.device("cuda", 1)


def test_a_ray_actor_computes_on_its_assigned_gpu(platform, monkeypatch):
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "4,6")
    platform.set_assigned_physical_ids((6,))
    assert platform.logical_to_physical(0) == 6
    assert platform.torch_device(0) == torch.device("cuda", 1)
    with pytest.raises(RuntimeError, match="already assigned"):
        platform.set_assigned_physical_ids((4,))
