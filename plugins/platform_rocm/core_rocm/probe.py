"""Cheap availability check for ROCm: reads device files, never initialises HIP."""

from __future__ import annotations

import os

from core.platforms import Unavailable
from core.platforms.torch_build import torch_build


def probe() -> str:
    build = torch_build()
    if build is None or build.hip is None:
        version = build.version if build else "(not installed)"
        raise Unavailable(f"torch {version} is not a ROCm build")
    if not os.path.exists("/dev/kfd"):
        raise Unavailable("no AMD GPU kernel driver (/dev/kfd) found")
    return "core_rocm.platform.RocmPlatform"
