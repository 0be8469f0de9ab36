"""Cheap availability check for CUDA: reads the driver's files, never initialises CUDA."""

from __future__ import annotations

import glob

import torch

from core.platforms import Unavailable


def probe() -> str:
    if torch.version.cuda is None:
        raise Unavailable(f"torch {torch.__version__} is not a CUDA build")
    if not glob.glob("/proc/driver/nvidia/gpus/*"):
        raise Unavailable("no NVIDIA GPU driver or device found")
    return "core_cuda.platform.CudaPlatform"
