"""The ROCm platform: imported only when the probe found a GPU and it was chosen.

PyTorch's ROCm build exposes HIP devices through the `cuda` device type.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from core.platforms import MemoryInfo, Platform
from core.platforms.device_graph import DeviceGraph, TorchCudaGraph


class RocmPlatform(Platform):
    """AMD GPUs through torch's ROCm (HIP) build.

    Attention prefers core-attn-flash's Triton kernels (Triton compiles for AMD GPUs
    too), then core's gathering reference backend; collectives run over RCCL. The KV
    cache is sized by profiling (--gpu-memory-utilization; Platform's torch.accelerator
    measurement) and the runner's inputs travel through pinned host memory. Devices are
    selected with HIP_VISIBLE_DEVICES (the probe says why none is usable).
    """

    name = "rocm"
    device_type = "cuda"
    device_name = "AMD ROCm GPU"
    dist_backend = "nccl"  # RCCL, under PyTorch's nccl name
    supported_dtypes = (torch.bfloat16, torch.float16, torch.float32)
    # awq: core-quant-awq's Triton kernel over AutoAWQ's layout. gguf, gptq and
    # compressed-tensors' pack-quantized weights: core's packed layout, multiplied by
    # core-quant-triton's core::quant_linear (Triton targets ROCm too), else its torch
    # reference; compressed-tensors' W8A8 by core::int8_linear's reference. fp8: W8A16 on a
    # dense copy of the weights (core.quantization.fp8).
    supported_quantization = ("awq", "compressed-tensors", "fp8", "gguf", "gptq")
    preferred_attention_backends = ("flash", "torch_ref")
    device_control_env_var = "HIP_VISIBLE_DEVICES"
    memory_profiling = True
    pin_memory = True
    # -O2 by default: decode batches replay CUDA graphs (HIP graphs on ROCm).
    supported_optimization_levels = (0, 1, 2)
    default_optimization_level = 2

    def device_count(self) -> int:
        # amdsmi's count where it loads (HIP stays uninitialised), else the runtime's.
        return torch.cuda.device_count()

    def memory_info(self) -> MemoryInfo:
        free, total = torch.cuda.mem_get_info()
        return MemoryInfo(total_bytes=total, available_bytes=free)

    def set_device(self, device: torch.device) -> None:
        torch.cuda.set_device(device)

    def capture_graph(self, fn: Callable[[], Any]) -> DeviceGraph:
        return TorchCudaGraph(fn)
