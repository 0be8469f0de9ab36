"""Cheap availability check for CUDA: reads torch's build record, the driver's files and
CUDA_VISIBLE_DEVICES; never imports torch, loads NVML or initialises CUDA."""

from __future__ import annotations

import glob

from core.platforms import Unavailable
from core.platforms.torch_build import torch_build
from core.platforms.visible_devices import check_visible_devices

# One directory per GPU the NVIDIA kernel driver manages (named by PCI bus id).
DRIVER_GPUS = "/proc/driver/nvidia/gpus/*"
VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"


def probe() -> str:
    build = torch_build()
    if build is None or build.cuda is None:
        version = build.version if build else "(not installed)"
        raise Unavailable(f"torch {version} is not a CUDA build")
    num_gpus = len(glob.glob(DRIVER_GPUS))
    if num_gpus == 0:
        raise Unavailable("no NVIDIA GPU driver or device found (/proc/driver/nvidia/gpus)")
    check_visible_devices(VISIBLE_DEVICES, num_gpus, "NVIDIA GPU")
    return "core_cuda.platform.CudaPlatform"
