"""The machine's ceilings, measured with the benchmarks' threads, and the model's size.

Two bounds frame every figure: a single stream's decode reads every weight once per token,
so it cannot beat read bandwidth / weight bytes; a large batch does 2 FLOPs per parameter
per token, so it cannot beat GEMM FLOP/s / (2 x params).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

# Big enough to defeat every cache level (a Zen3's L3 is 32 MiB), small enough to stay cheap.
BANDWIDTH_BYTES = 512 << 20
GEMM_SIZE = 2048
FP32_BYTES = 4


@dataclass(frozen=True)
class ModelSize:
    num_params: int
    fp32_weight_bytes: int
    file_weight_bytes: int  # as stored in the GGUF (quantized)


@dataclass(frozen=True)
class Ceilings:
    num_threads: int
    read_bandwidth_gb_s: float
    gemm_gflop_s: float
    model: ModelSize

    @property
    def decode_tokens_per_s(self) -> float:
        """Single-stream decode bound with float32 weights: bandwidth / weight bytes."""
        return self.read_bandwidth_gb_s * 1e9 / self.model.fp32_weight_bytes

    @property
    def file_decode_tokens_per_s(self) -> float:
        """The same bound for an engine that reads the file's quantized weights."""
        return self.read_bandwidth_gb_s * 1e9 / self.model.file_weight_bytes

    @property
    def batched_tokens_per_s(self) -> float:
        """Batched bound: GEMM FLOP/s / (2 x params)."""
        return self.gemm_gflop_s * 1e9 / (2 * self.model.num_params)

    def to_dict(self) -> dict:
        return {
            **asdict(self),
            "decode_tokens_per_s": self.decode_tokens_per_s,
            "file_decode_tokens_per_s": self.file_decode_tokens_per_s,
            "batched_tokens_per_s": self.batched_tokens_per_s,
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
    """Memory read bandwidth: a float32 sum streams every byte once (best of `repeats`)."""
    x = torch.ones(num_bytes // FP32_BYTES, dtype=torch.float32)  # x: [N]
    return num_bytes / best_seconds(lambda: x.sum(), repeats) / 1e9


def gemm_gflop_s(size: int = GEMM_SIZE, repeats: int = 10) -> float:
    """float32 GEMM throughput of torch.mm on [size, size] operands (best of `repeats`)."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=generator)  # a: [S, S]
    b = torch.randn(size, size, generator=generator)  # b: [S, S]
    return 2 * size**3 / best_seconds(lambda: torch.mm(a, b), repeats) / 1e9


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
    """Both ceilings with torch's current thread count, and the model's size."""
    return Ceilings(
        num_threads=torch.get_num_threads(),
        read_bandwidth_gb_s=read_bandwidth_gb_s(repeats=repeats),
        gemm_gflop_s=gemm_gflop_s(repeats=repeats),
        model=model_size(gguf_path),
    )


__all__ = ["Ceilings", "ModelSize", "gemm_gflop_s", "measure", "model_size", "read_bandwidth_gb_s"]
