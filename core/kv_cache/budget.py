"""The KV-cache memory budget, turned into a number of blocks, and checks that it suffices.

The budget is --kv-cache-memory when given. Otherwise a platform whose device memory is
the engine's alone (Platform.memory_profiling) profiles it: each rank runs a forward of
the largest batch before the cache exists and the cache gets
`--gpu-memory-utilization x total - peak` (`profiled_kv_cache_budget`); other platforms
take a fraction of the available memory (`default_kv_cache_budget`).

One block id costs one page in every layer (each group's KVCacheTensor holds
`num_blocks` pages per layer), so num_blocks = budget // sum of the layers' page sizes.
Block 0 is the null block, so `num_blocks - 1` blocks hold tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from core.kv_cache.grouping import kv_cache_bytes_per_block
from core.kv_cache.single_type_manager import cdiv
from core.kv_cache.spec import KVCacheSpec
from core.platforms.interface import Platform

__all__ = [
    "CPU_KV_CACHE_CAP_BYTES",
    "CPU_KV_CACHE_FRACTION",
    "DEVICE_KV_CACHE_FRACTION",
    "MemoryProfile",
    "check_max_model_len_fits",
    "default_kv_cache_budget",
    "kv_cache_capacity",
    "num_blocks_for_budget",
    "profiled_kv_cache_budget",
]

# On the CPU the cache shares RAM with the OS, the weights, the tokenizer and every other
# process, and swapping would be far slower than recomputing: take a quarter of what is
# available. Past 4 GiB a CPU cannot use it: SmolLM2-135M in float32 costs 45 KiB of KV
# per token, so 4 GiB already holds ~90k tokens, more context than two cores can keep
# busy at interactive speed.
CPU_KV_CACHE_FRACTION = 0.25
CPU_KV_CACHE_CAP_BYTES = 4 << 30
# An accelerator that does not profile: its memory is the engine's alone and the weights
# are loaded before the budget is taken; the rest leaves room for activations and
# allocator fragmentation without a profiling run.
DEVICE_KV_CACHE_FRACTION = 0.8


@dataclass(frozen=True)
class MemoryProfile:
    """One rank's device memory, measured before its KV cache exists.

    `free_at_start_bytes` was free when the worker took the device (other processes hold
    the rest); `peak_bytes` is what this process held at the peak of a forward of the
    largest batch: weights, activations and allocations outside torch
    (Platform.peak_memory_bytes).
    """

    total_bytes: int
    free_at_start_bytes: int
    peak_bytes: int


def num_blocks_for_budget(specs_by_layer: Mapping[str, KVCacheSpec], budget_bytes: int) -> int:
    """How many block ids (the null block included) `budget_bytes` pays for."""
    if not specs_by_layer:
        raise ValueError("specs_by_layer is empty: the model has no KV-cache layers")
    if budget_bytes < 1:
        raise ValueError(f"budget_bytes must be >= 1, got {budget_bytes}")
    return budget_bytes // kv_cache_bytes_per_block(specs_by_layer)


def default_kv_cache_budget(platform: Platform) -> int:
    """The KV-cache budget in bytes when the user gives none (see the fractions above)."""
    available = platform.memory_info().available_bytes
    if platform.device_type == "cpu":
        return min(int(available * CPU_KV_CACHE_FRACTION), CPU_KV_CACHE_CAP_BYTES)
    return int(available * DEVICE_KV_CACHE_FRACTION)


def profiled_kv_cache_budget(profiles: Sequence[MemoryProfile], utilization: float) -> int:
    """The KV-cache bytes every rank can hold (the least over `profiles`, in rank order):
    `utilization` x total - peak. ValueError naming --gpu-memory-utilization, with the
    numbers, when a device had less free memory at start than that share or when the
    share leaves nothing for the cache."""
    return min(_rank_budget(rank, p, utilization) for rank, p in enumerate(profiles))


def _rank_budget(rank: int, profile: MemoryProfile, utilization: float) -> int:
    share = int(utilization * profile.total_bytes)
    asked = (
        f"--gpu-memory-utilization {utilization} x {format_bytes(profile.total_bytes)} "
        f"= {format_bytes(share)} on rank {rank}"
    )
    if profile.free_at_start_bytes < share:
        raise ValueError(
            f"{asked}, but only {format_bytes(profile.free_at_start_bytes)} was free when "
            "its worker started (other processes hold the rest); lower "
            "--gpu-memory-utilization or free the device"
        )
    budget = share - profile.peak_bytes
    if budget <= 0:
        raise ValueError(
            f"{asked} leaves no KV cache: the model's peak without it is "
            f"{format_bytes(profile.peak_bytes)} (weights, activations of the largest "
            "batch); raise --gpu-memory-utilization or lower --max-num-batched-tokens"
        )
    return budget


def check_max_model_len_fits(
    specs_by_layer: Mapping[str, KVCacheSpec],
    num_blocks: int,
    max_model_len: int,
    budget_bytes: int,
) -> None:
    """Raise ValueError unless one request of `max_model_len` tokens fits in the cache.

    Conservative for sliding-window layers, which would hold fewer blocks: a prompt
    prefilled in one step needs a block for every token before the window frees any.
    """
    block_size = min(spec.block_size for spec in specs_by_layer.values())
    num_usable = max(num_blocks - 1, 0)
    if num_usable < cdiv(max_model_len, block_size):
        raise ValueError(
            f"KV cache budget {format_bytes(budget_bytes)} fits {num_usable} blocks = "
            f"{num_usable * block_size} tokens, but max_model_len is {max_model_len}; "
            "raise --kv-cache-memory or lower --max-model-len"
        )


def kv_cache_capacity(num_blocks: int, block_size: int, max_model_len: int) -> tuple[int, float]:
    """What `num_blocks` block ids hold in every KV-cache group (vLLM's kv_cache_size_tokens
    and kv_cache_max_concurrency): the tokens of their usable blocks, and how many requests
    of `max_model_len` tokens fit at once, each taking cdiv(max_model_len, block_size)."""
    num_usable = max(num_blocks - 1, 0)
    return num_usable * block_size, num_usable / cdiv(max_model_len, block_size)


def format_bytes(num_bytes: int) -> str:
    """A byte count in the largest binary unit that keeps it >= 1 ("1.50 GiB", "512 B")."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if num_bytes >= size:
            return f"{num_bytes / size:.2f} {unit}"
    return f"{num_bytes} B"
