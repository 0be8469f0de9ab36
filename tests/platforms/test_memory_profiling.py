"""Platform's default peak-memory measurement (torch.accelerator's statistics, mocked here:
no device), and which platforms profile memory and pin their inputs."""

from __future__ import annotations

import pytest
import torch

from core.platforms.cpu import CpuPlatform
from core.platforms.interface import MemoryInfo, Platform

MIB = 1 << 20


class Device:
    """One device as torch.accelerator reports it: torch's caching allocator (allocated
    bytes, their peak, reserved bytes that include freed cached blocks) beside memory
    allocated outside torch (the runtime, libraries, other processes)."""

    def __init__(self, total: int, outside_torch: int) -> None:
        self.total = total
        self.outside_torch = outside_torch
        self.allocated = self.peak = self.reserved = 0

    def allocate(self, num_bytes: int) -> None:
        self.allocated += num_bytes
        self.peak = max(self.peak, self.allocated)
        self.reserved = max(self.reserved, self.allocated)

    def free(self, num_bytes: int) -> None:
        self.allocated -= num_bytes  # the block stays reserved (cached)

    # torch.accelerator's API:
    def get_memory_info(self) -> tuple[int, int]:
        return self.total - self.reserved - self.outside_torch, self.total

    def memory_reserved(self) -> int:
        return self.reserved

    def max_memory_allocated(self) -> int:
        return self.peak

    def reset_peak_memory_stats(self) -> None:
        self.peak = self.allocated

    def empty_cache(self) -> None:
        self.reserved = self.allocated


class Accelerator(Platform):
    name = "acc"
    device_type = "acc"
    device_name = "an accelerator"
    dist_backend = "gloo"
    supported_dtypes = (torch.float32,)
    preferred_attention_backends = ("torch_ref",)
    memory_profiling = True

    def memory_info(self) -> MemoryInfo:
        raise NotImplementedError

    def set_device(self, device: torch.device) -> None:
        pass


@pytest.fixture
def device(monkeypatch) -> Device:
    device = Device(total=1024 * MIB, outside_torch=300 * MIB)  # the context, other processes
    for name in (
        "get_memory_info",
        "memory_reserved",
        "max_memory_allocated",
        "reset_peak_memory_stats",
        "empty_cache",
    ):
        monkeypatch.setattr(torch.accelerator, name, getattr(device, name))
    return device


def test_peak_counts_weights_peak_activations_and_new_memory_outside_torch(device):
    platform = Accelerator()
    device.allocate(100 * MIB)  # weights
    device.allocate(80 * MIB)
    device.free(80 * MIB)  # a loading buffer: its peak is over before the measurement
    platform.reset_peak_memory()
    device.allocate(50 * MIB)  # the forward's activations at their peak
    device.outside_torch += 7 * MIB  # e.g. a library's workspace, created by the forward
    device.free(50 * MIB)
    assert platform.peak_memory_bytes() == (100 + 50 + 7) * MIB


def test_peak_before_a_reset_is_an_error(device):
    with pytest.raises(RuntimeError, match="reset_peak_memory must run first"):
        Accelerator().peak_memory_bytes()


def test_only_device_platforms_profile_memory_and_pin_inputs():
    assert not CpuPlatform.memory_profiling and not CpuPlatform.pin_memory
    assert Accelerator.memory_profiling
