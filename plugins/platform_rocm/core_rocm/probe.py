"""Cheap availability check for ROCm: reads torch's build record, the kernel driver's
topology and the device-selection variables; never imports torch or initialises HIP."""

from __future__ import annotations

import glob
import os
from pathlib import Path

from core.platforms import Unavailable
from core.platforms.torch_build import torch_build
from core.platforms.visible_devices import check_visible_devices

KFD = "/dev/kfd"
# One node per CPU socket and per GPU; a GPU node's gpu_id is non-zero.
KFD_NODES = "/sys/class/kfd/kfd/topology/nodes/*/gpu_id"
# HIP reads its own variable and CUDA's, with CUDA's rules: either can hide every GPU.
VISIBLE_DEVICES = ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")


def probe() -> str:
    build = torch_build()
    if build is None or build.hip is None:
        version = build.version if build else "(not installed)"
        raise Unavailable(f"torch {version} is not a ROCm build")
    if not os.path.exists(KFD):
        raise Unavailable(f"no AMD GPU kernel driver ({KFD}) found")
    num_gpus = count_gpus()
    if num_gpus == 0:
        raise Unavailable("the AMD GPU kernel driver lists no GPU (/sys/class/kfd topology)")
    for env_var in VISIBLE_DEVICES:
        check_visible_devices(env_var, num_gpus, "AMD GPU")
    return "core_rocm.platform.RocmPlatform"


def count_gpus() -> int:
    """GPU nodes in the KFD topology (CPU nodes have gpu_id 0); unreadable ones skipped."""
    return sum(_gpu_id(Path(path)) != 0 for path in glob.glob(KFD_NODES))


def _gpu_id(path: Path) -> int:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return 0
