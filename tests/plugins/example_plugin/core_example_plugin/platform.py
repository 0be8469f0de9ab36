"""The example platform: the host CPU under another name, preferring the example backend.

Imported only once the probe said it is available and core chose it.
"""

from __future__ import annotations

import os

import torch

from core.platforms import MemoryInfo, Platform


class ExamplePlatform(Platform):
    name = "example"
    device_type = "cpu"
    device_name = "example device (the host CPU)"
    dist_backend = "gloo"
    supported_dtypes = (torch.float32, torch.bfloat16)
    preferred_attention_backends = ("example_paged", "torch_ref")

    def memory_info(self) -> MemoryInfo:
        page = os.sysconf("SC_PAGE_SIZE")
        total = os.sysconf("SC_PHYS_PAGES") * page
        return MemoryInfo(total, os.sysconf("SC_AVPHYS_PAGES") * page)

    def set_device(self, device: torch.device) -> None:
        if device.type != "cpu":
            raise ValueError(f"the example platform cannot use device {device}")
