"""The ROCm platform: imported only when the probe found a GPU and it was chosen.

PyTorch's ROCm build exposes HIP devices through the `cuda` device type.
"""

from __future__ import annotations

import torch

from core.platforms import MemoryInfo, Platform


class RocmPlatform(Platform):
    name = "rocm"
    device_type = "cuda"
    device_name = "AMD ROCm GPU"
    dist_backend = "nccl"  # RCCL, under PyTorch's nccl name
    supported_dtypes = (torch.bfloat16, torch.float16, torch.float32)
    # awq: core-quant-awq's Triton kernel (Triton targets ROCm too); gguf: core's torch
    # reference of quant_linear.
    supported_quantization = ("awq", "gguf")
    preferred_attention_backends = ("torch_ref",)
    device_control_env_var = "HIP_VISIBLE_DEVICES"

    def device_count(self) -> int:
        return torch.cuda.device_count()  # torch's HIP build counts ROCm devices here

    def memory_info(self) -> MemoryInfo:
        free, total = torch.cuda.mem_get_info()
        return MemoryInfo(total_bytes=total, available_bytes=free)

    def set_device(self, device: torch.device) -> None:
        torch.cuda.set_device(device)
