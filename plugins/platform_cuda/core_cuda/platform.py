"""The CUDA platform: imported only when the probe found a GPU and it was chosen."""

from __future__ import annotations

import torch

from core.platforms import MemoryInfo, Platform


class CudaPlatform(Platform):
    name = "cuda"
    device_type = "cuda"
    device_name = "NVIDIA CUDA GPU"
    dist_backend = "nccl"
    supported_dtypes = (torch.bfloat16, torch.float16, torch.float32)
    # awq: core-quant-awq's Triton kernel; gguf: core's torch reference of quant_linear.
    supported_quantization = ("awq", "gguf")
    preferred_attention_backends = ("flash", "torch_ref")
    device_control_env_var = "CUDA_VISIBLE_DEVICES"

    def device_count(self) -> int:
        return torch.cuda.device_count()  # NVML-based: does not initialise CUDA

    def memory_info(self) -> MemoryInfo:
        free, total = torch.cuda.mem_get_info()
        return MemoryInfo(total_bytes=total, available_bytes=free)

    def set_device(self, device: torch.device) -> None:
        torch.cuda.set_device(device)
