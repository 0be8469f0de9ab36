"""The CPU platform, built into core; its probe (the `cpu` entry point) is in cpu_probe.py."""

from __future__ import annotations

import functools
import mmap
import os

import torch

from core.config import UsageContext
from core.platforms.cpu_dtype import DtypeChoice, choose_cpu_dtype
from core.platforms.interface import MemoryInfo, Platform

# A server's steps are sized from measured step times (core/scheduler/step_budget.py, on
# because the burst budget below is set): 80 tokens is only the budget of steps before a
# step is timed (the engine core times two dummy forwards at start), and 8192 the most
# tokens a step may take (what the model runner's buffers hold).
SERVING_TOKEN_BUDGET = 80
SERVING_BURST_TOKEN_BUDGET = 8192


class CpuPlatform(Platform):
    """Runs everything on the host CPU: bfloat16 where the CPU multiplies it natively (AMX
    or AVX512_BF16) and a probe measures it faster, float32 elsewhere (cpu_dtype.py).

    Measured with 2 threads: on an AMX Xeon, torch's bf16 matmul runs 3-7x faster than
    fp32 at batch 64 (W1 1.8x end to end) and no slower for single-stream decode; on CPUs
    without it (e.g. Zen 3) bf16 matmuls are orders of magnitude slower than fp32 GEMM.
    """

    name = "cpu"
    device_type = "cpu"
    device_name = "CPU"
    dist_backend = "gloo"
    supported_dtypes = (torch.float32, torch.bfloat16, torch.float16)
    # awq, gguf and gptq keep 4- or 8-bit weights packed; core::quant_linear's C++ kernel
    # comes with core-cpu-kernels (without it, its torch reference). awq needs
    # core-quant-awq. fp8 runs W8A16 (core.quantization.fp8).
    supported_quantization = ("awq", "compressed-tensors", "fp8", "gguf", "gptq")
    # cpu_paged comes with the optional core-cpu-kernels plugin; without it, torch_ref.
    preferred_attention_backends = ("cpu_paged", "torch_ref")
    # No graphs to capture on a CPU. -O1 (torch.compile, inductor's C++ code) is available;
    # the default stays eager until a benchmark shows it wins within the cold-start
    # budget (DESIGN.md section 6; benchmarks/compile.py).
    supported_optimization_levels = (0, 1)
    default_optimization_level = 0
    batch_invariant = True  # its kernels and core's references (core.batch_invariant)

    @property
    def default_dtype(self) -> torch.dtype:
        return self.dtype_choice().dtype

    @property
    def default_dtype_reason(self) -> str:
        return self.dtype_choice().reason

    def dtype_choice(self) -> DtypeChoice:
        """The default dtype and why: measured on the first call where bfloat16 is a
        candidate, not when the platform is built (`core --help` never pays for it)."""
        model_name = cpuinfo().get("model name", "unknown CPU")
        return choose_cpu_dtype(model_name, cpu_flags(), torch.get_num_threads())

    def default_max_num_batched_tokens(self, usage: UsageContext) -> int:
        # A CPU step costs about as much per prefill token as per decode row, so a big
        # prefill chunk stalls every stream beside it; a server sizes its steps from
        # measured times instead (SERVING_TOKEN_BUDGET). Offline keeps big prefill steps.
        if usage is UsageContext.SERVING:
            return SERVING_TOKEN_BUDGET
        return super().default_max_num_batched_tokens(usage)

    def default_burst_token_budget(self, usage: UsageContext) -> int | None:
        # Set for a server: its steps are sized from measured times, up to this many tokens.
        return SERVING_BURST_TOKEN_BUDGET if usage is UsageContext.SERVING else None

    def zeroed_bytes(self, num_bytes: int, device: torch.device) -> torch.Tensor:
        """An anonymous memory map: the kernel hands out its pages zeroed when first
        touched, so a cache of gigabytes costs nothing at start (torch.zeros wrote all
        4 GiB of the default cache: 4.9 s of a 12.5 s `core serve` start on a VM)."""
        if device.type != "cpu":
            return super().zeroed_bytes(num_bytes, device)
        if num_bytes == 0:
            return torch.zeros(0, dtype=torch.int8)
        # frombuffer holds a reference to the map, which lives as long as the tensor.
        return torch.frombuffer(mmap.mmap(-1, num_bytes), dtype=torch.int8)

    def memory_info(self) -> MemoryInfo:
        return MemoryInfo(_meminfo("MemTotal"), _meminfo("MemAvailable"))

    def set_device(self, device: torch.device) -> None:
        if device.type != "cpu":
            raise ValueError(f"the CPU platform cannot use device {device}")

    def torch_device(self, local_rank: int = 0) -> torch.device:
        # One host, one "device": every rank of a CPU run shares it.
        return torch.device("cpu")


@functools.cache
def cpuinfo() -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo (empty where there is none)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():  # the first processor's block ends here
                    break
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    return fields


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (e.g. "amx_bf16"); empty where they cannot be read."""
    return frozenset(cpuinfo().get("flags", "").split())


def _meminfo(field: str) -> int:
    """A /proc/meminfo field in bytes; falls back to sysconf where /proc is absent."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    pages = os.sysconf("SC_AVPHYS_PAGES" if field == "MemAvailable" else "SC_PHYS_PAGES")
    return pages * os.sysconf("SC_PAGE_SIZE")
