"""The CPU platform, built into core; its probe (the `cpu` entry point) is in cpu_probe.py."""

from __future__ import annotations

import functools
import mmap
import os

import torch

from core.config import UsageContext
from core.platforms.cpu_dtype import DtypeChoice, choose_cpu_dtype
from core.platforms.interface import MemoryInfo, Platform

SERVING_TOKEN_BUDGET = 80
# W3 (32 streams of 128 tokens, 64 requests; SmolLM2 GGUF, bf16, AVX512_BF16 EPYC, 2 cores):
# without bursts every arrival trickles in at 80 tokens a step beside the streams already
# decoding, so the requests' decodes stagger and most steps carry a prefill chunk (236-243
# output tok/s, ITL 95-100 ms median, 150-166 p99); with bursts of up to 8192 tokens each
# wave of 32 arrivals is prefilled in one 3.5-4.4 s step and then decodes together (286
# tok/s, ITL 79 ms median, 104 p99, TTFT p99 4.6 s instead of 7.8-9.6). 2048 took 13 of 31
# requests at once and then trickled the rest (244 tok/s).
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
    # Both keep 4-bit weights packed; core::quant_linear's C++ kernel comes with
    # core-cpu-kernels (without it, its torch reference). awq needs core-quant-awq.
    supported_quantization = ("awq", "gguf")
    # cpu_paged comes with the optional core-cpu-kernels plugin; without it, torch_ref.
    preferred_attention_backends = ("cpu_paged", "torch_ref")
    # No graphs to capture on a CPU. -O1 (torch.compile, inductor's C++ code) is available;
    # the default stays eager until a benchmark shows it wins within the cold-start
    # budget (DESIGN.md section 6; benchmarks/compile.py).
    supported_optimization_levels = (0, 1)
    default_optimization_level = 0

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
        # prefill chunk stalls every stream beside it. W3 (32 streams, SmolLM2, 2 cores):
        # bf16 on AMX, budget 128 -> ITL p99/median 2.06, 96 -> 2.01, 64 -> 1.87 (output
        # 200, 211, 193 tok/s; median TTFT 2.0, 2.3, 4.4 s); fp32 on an AVX2 EPYC with
        # core-cpu-kernels, 128 -> 2.16, 96 -> 1.79, 64 -> 1.18 (174, 175, 162 tok/s;
        # median TTFT 2.7, 3.2, 5.2 s). Faster decode steps (the blocked GEMM) raised the
        # ratio at 96 to 1.85-2.05 over six runs (173-186 tok/s); 80 -> 1.63 (177 tok/s),
        # 64 -> 1.13 (177), 256 -> 4.05 (192). Offline keeps big prefill steps.
        if usage is UsageContext.SERVING:
            return SERVING_TOKEN_BUDGET
        return super().default_max_num_batched_tokens(usage)

    def default_burst_token_budget(self, usage: UsageContext) -> int | None:
        # Offline runs keep large steps anyway; a server's small budget protects its streams.
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
