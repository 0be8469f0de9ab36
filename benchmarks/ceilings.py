"""The machine's ceilings, measured with the benchmarks' threads, and the model's size.

Two bounds frame every figure: a single stream's decode reads every weight once per token,
so it cannot beat read bandwidth / weight bytes; a large batch does 2 FLOPs per parameter
per token, so it cannot beat GEMM FLOP/s / (2 x params). The GEMM bound is per dtype: an
AMX CPU runs a bfloat16 GEMM ~7x faster than a float32 one, so a bfloat16 engine measured
against the float32 bound would show far above 100%.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from core import kernel_choice

# Big enough to defeat every cache level (a Zen3's L3 is 32 MiB), small enough to stay cheap.
BANDWIDTH_BYTES = kernel_choice.MAX_BANDWIDTH_BYTES
GEMM_SIZE = 2048
FP32_BYTES = 4
# A CPU without native kernels for a dtype runs its GEMM ~100x slower than float32 (bfloat16
# at ~1 GFLOP/s on a Zen3: ~15 s a GEMM_SIZE call). Such a dtype is timed at PROBE_SIZE
# first, and at GEMM_SIZE only when the estimate from that fits GEMM_BUDGET_S.
PROBE_SIZE = 512
PROBE_REPEATS = 3
GEMM_BUDGET_S = 10.0
# The dtypes with a GEMM ceiling, by the names engines report (`str(torch.dtype)` sans "torch.").
GEMM_DTYPES = ("float32", "bfloat16", "int8")


@dataclass(frozen=True)
class ModelSize:
    num_params: int
    fp32_weight_bytes: int
    file_weight_bytes: int  # as stored in the GGUF (quantized)


@dataclass(frozen=True)
class GemmCeiling:
    """A GEMM's throughput in one dtype: 2 x size^3 ops per call (FLOPs, or integer ops for
    int8) over the best call's seconds, in billions per second."""

    gop_s: float
    size: int  # the square size timed: below GEMM_SIZE when GEMM_SIZE was too slow here


@dataclass(frozen=True)
class Ceilings:
    num_threads: int
    read_bandwidth_gb_s: float
    fp32_gemm_gflop_s: float  # at GEMM_SIZE: float32 GEMMs are fast on every CPU
    model: ModelSize
    # None: torch runs no such GEMM on this CPU (or it was not measured).
    bf16_gemm: GemmCeiling | None = None
    int8_gemm: GemmCeiling | None = None

    @property
    def decode_tokens_per_s(self) -> float:
        """Single-stream decode bound with float32 weights: bandwidth / weight bytes."""
        return self.read_bandwidth_gb_s * 1e9 / self.model.fp32_weight_bytes

    @property
    def file_decode_tokens_per_s(self) -> float:
        """The same bound for an engine that reads the file's quantized weights."""
        return self.read_bandwidth_gb_s * 1e9 / self.model.file_weight_bytes

    def gemm(self, dtype: str) -> GemmCeiling | None:
        """The GEMM ceiling of `dtype` (a GEMM_DTYPES name); None when it was not measured
        or `dtype` has none."""
        gemms = {
            "float32": GemmCeiling(self.fp32_gemm_gflop_s, GEMM_SIZE),
            "bfloat16": self.bf16_gemm,
            "int8": self.int8_gemm,
        }
        return gemms.get(dtype)

    def batched_tokens_per_s(self, dtype: str) -> float | None:
        """Batched bound of an engine computing in `dtype`: its GEMM ops/s / (2 x params);
        None when `dtype` has no GEMM ceiling."""
        gemm = self.gemm(dtype)
        return None if gemm is None else gemm.gop_s * 1e9 / (2 * self.model.num_params)

    def to_dict(self) -> dict:
        return {
            **asdict(self),
            "decode_tokens_per_s": self.decode_tokens_per_s,
            "file_decode_tokens_per_s": self.file_decode_tokens_per_s,
            "batched_tokens_per_s": {d: self.batched_tokens_per_s(d) for d in GEMM_DTYPES},
        }


def best_seconds(fn: Callable[[], object], repeats: int) -> float:
    """The fastest of `repeats` timed calls, after one untimed warm-up call."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def read_bandwidth_gb_s(num_bytes: int = BANDWIDTH_BYTES, repeats: int = 10) -> float:
    """Memory read bandwidth: core's kernel choices' measure of it (a float32 sum streams
    every byte once, best of `repeats`)."""
    return kernel_choice.read_bandwidth(num_bytes, repeats) / 1e9


def _random_matrix(dtype: torch.dtype, size: int, generator: torch.Generator) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(size, size, generator=generator).to(dtype)
    return torch.randint(-128, 128, (size, size), generator=generator, dtype=dtype)


def gemm_gop_s(
    dtype: torch.dtype = torch.float32, size: int = GEMM_SIZE, repeats: int = 10
) -> float:
    """GEMM throughput (billions of ops/s) on [size, size] `dtype` operands, best of `repeats`:
    torch.mm for float dtypes, torch._int_mm (int8 x int8 -> int32, as torch has no integer
    torch.mm kernel) for int8. Raises RuntimeError or AttributeError where torch runs no
    such GEMM on this CPU."""
    generator = torch.Generator().manual_seed(0)
    a = _random_matrix(dtype, size, generator)  # a: [S, S]
    b = _random_matrix(dtype, size, generator)  # b: [S, S]
    matmul = torch.mm if dtype.is_floating_point else torch._int_mm
    return 2 * size**3 / best_seconds(lambda: matmul(a, b), repeats) / 1e9


def gemm_ceiling(
    dtype: torch.dtype, repeats: int = 10, budget_s: float = GEMM_BUDGET_S
) -> GemmCeiling | None:
    """`dtype`'s GEMM ceiling: timed at GEMM_SIZE (best of `repeats`) when a PROBE_SIZE
    timing says those calls fit `budget_s`, else the PROBE_SIZE figure (per-op throughput
    hardly grows with size on a CPU this slow). None where torch runs no `dtype` GEMM here:
    this tries it rather than reading CPU flags, which do not say what torch's build runs."""
    try:
        probe = gemm_gop_s(dtype, PROBE_SIZE, PROBE_REPEATS)
    except (AttributeError, RuntimeError):
        return None
    full_call_s = 2 * GEMM_SIZE**3 / (probe * 1e9)
    if full_call_s * (repeats + 1) > budget_s:
        return GemmCeiling(probe, PROBE_SIZE)
    return GemmCeiling(gemm_gop_s(dtype, GEMM_SIZE, repeats), GEMM_SIZE)


def model_size(gguf_path: Path) -> ModelSize:
    """Parameters and weight bytes of a GGUF checkpoint, from its tensor table."""
    from gguf import GGUFReader

    tensors = GGUFReader(str(gguf_path)).tensors
    num_params = sum(int(t.n_elements) for t in tensors)
    return ModelSize(
        num_params=num_params,
        fp32_weight_bytes=FP32_BYTES * num_params,
        file_weight_bytes=sum(int(t.n_bytes) for t in tensors),
    )


def measure(gguf_path: Path, repeats: int = 10) -> Ceilings:
    """Every ceiling with torch's current thread count, and the model's size."""
    return Ceilings(
        num_threads=torch.get_num_threads(),
        read_bandwidth_gb_s=read_bandwidth_gb_s(repeats=repeats),
        fp32_gemm_gflop_s=gemm_gop_s(torch.float32, GEMM_SIZE, repeats),
        model=model_size(gguf_path),
        bf16_gemm=gemm_ceiling(torch.bfloat16, repeats),
        int8_gemm=gemm_ceiling(torch.int8, repeats),
    )


__all__ = [
    "GEMM_DTYPES",
    "GEMM_SIZE",
    "Ceilings",
    "GemmCeiling",
    "ModelSize",
    "gemm_ceiling",
    "gemm_gop_s",
    "measure",
    "model_size",
    "read_bandwidth_gb_s",
]
