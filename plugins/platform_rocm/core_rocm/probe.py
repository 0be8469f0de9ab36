"""Cheap availability check for ROCm: reads device files, never initialises HIP."""

from __future__ import annotations

import os

import torch

from core.platforms import Unavailable


def probe() -> str:
    if getattr(torch.version, "hip", None) is None:
        raise Unavailable(f"torch {torch.__version__} is not a ROCm build")
    if not os.path.exists("/dev/kfd"):
        raise Unavailable("no AMD GPU kernel driver (/dev/kfd) found")
    return "core_rocm.platform.RocmPlatform"
