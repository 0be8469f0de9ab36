"""The logical / physical / visible device-id namespaces of a platform."""

from __future__ import annotations

import pytest
import torch

from core.platforms import MemoryInfo, Platform


class FakeGpuPlatform(Platform):
    name = "fakegpu"
    device_type = "cpu"
    device_name = "fake GPU"
    dist_backend = "gloo"
    supported_dtypes = (torch.float32,)
    preferred_attention_backends = ()
    device_control_env_var = "FAKE_VISIBLE_DEVICES"

    def memory_info(self) -> MemoryInfo:
        return MemoryInfo(1, 1)

    def set_device(self, device: torch.device) -> None:
        pass


def test_ids_are_identity_without_the_env_var(monkeypatch):
    monkeypatch.delenv("FAKE_VISIBLE_DEVICES", raising=False)
    platform = FakeGpuPlatform()
    assert platform.logical_to_physical(3) == 3
    assert platform.logical_to_visible(3) == 3


def test_env_var_remaps_logical_to_physical(monkeypatch):
    monkeypatch.setenv("FAKE_VISIBLE_DEVICES", "4,5")
    platform = FakeGpuPlatform()
    assert [platform.logical_to_physical(i) for i in (0, 1)] == [4, 5]
    assert [platform.logical_to_visible(i) for i in (0, 1)] == [0, 1]


def test_empty_env_var_counts_as_unset(monkeypatch):
    monkeypatch.setenv("FAKE_VISIBLE_DEVICES", "")
    assert FakeGpuPlatform().logical_to_visible(2) == 2


def test_assigned_physical_ids_map_through_the_visible_list(monkeypatch):
    monkeypatch.setenv("FAKE_VISIBLE_DEVICES", "2,4,5")
    platform = FakeGpuPlatform()
    platform.set_assigned_physical_ids((5, 4))
    assert platform.logical_to_physical(0) == 5
    assert platform.logical_to_visible(0) == 2
    platform.set_assigned_physical_ids((5, 4))  # the same value again is a no-op
    with pytest.raises(RuntimeError, match="already assigned"):
        platform.set_assigned_physical_ids((1,))


def test_a_physical_id_outside_the_visible_list_is_an_error(monkeypatch):
    monkeypatch.setenv("FAKE_VISIBLE_DEVICES", "0,1")
    platform = FakeGpuPlatform()
    platform.set_assigned_physical_ids((7,))
    with pytest.raises(RuntimeError, match="not in FAKE_VISIBLE_DEVICES"):
        platform.logical_to_visible(0)
