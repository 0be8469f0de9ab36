"""Cheap availability check for CUDA: reads the driver's files, never initialises CUDA."""

from __future__ import annotations

import glob

from core.platforms import Unavailable
from core.platforms.torch_build import torch_build


def probe() -> str:
    build = torch_build()
    if build is None or build.cuda is None:
        version = build.version if build else "(not installed)"
        raise Unavailable(f"torch {version} is not a CUDA build")
    if not glob.glob("/proc/driver/nvidia/gpus/*"):
        raise Unavailable("no NVIDIA GPU driver or device found")
    return "core_cuda.platform.CudaPlatform"
