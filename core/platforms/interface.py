"""The Platform interface: what core needs to know about one kind of hardware.

A platform plugin registers, in the `core.platforms` group, a cheap zero-argument probe
that returns the dotted path of its Platform subclass when the machine can run it and
returns None or raises `Unavailable(reason)` when it cannot. The probe must not
initialise a device runtime; the class itself is imported only when chosen.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from core.config import (
    COMPILE_LEVEL,
    GRAPH_CAPTURE_LEVEL,
    QUANTIZATION_NONE,
    CacheConfig,
    CompilationConfig,
    UsageContext,
)
from core.distributed.communicator import DeviceCommunicator
from core.platforms.device_graph import DeviceGraph
from core.platforms.unavailable import Unavailable

__all__ = ["MemoryInfo", "Platform", "Unavailable"]

# Tokens per step (with chunked prefill) when neither the user nor the platform sets one.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048

# What each optimization level needs from a platform, for the refusal message.
_LEVEL_NEEDS = {
    0: "is not supported",
    COMPILE_LEVEL: "needs a platform with torch.compile",
    GRAPH_CAPTURE_LEVEL: "needs a platform with graph capture",
    3: "is reserved (no optimizations defined)",
}


@dataclass(frozen=True)
class MemoryInfo:
    total_bytes: int
    available_bytes: int


class Platform(ABC):
    """One kind of device: its identity, memory, defaults and preferred components.

    Contract:
    - `device_type` is the torch device type ("cpu", "cuda", ...); `device_name` a
      human-readable name; `dist_backend` the torch.distributed backend of the device
      groups (gloo on the CPU, nccl on CUDA and ROCm); `device_communicator_cls` the
      collectives over them (core.distributed.communicator.DeviceCommunicator, which a
      GPU plugin may subclass with a custom all-reduce).
    - `supported_dtypes` lists the model dtypes it runs, the first one being the
      default; `supported_quantization` the quantization method names it accepts.
    - `preferred_attention_backends` and `preferred_sampler` name entry points, in
      order of preference; the selectors walk them and fall back with a reason.
    - `supported_optimization_levels` lists the -O levels it honours (DESIGN.md section
      6; cumulative: a level includes what every lower level turns on);
      `default_optimization_level`, one of them, is what a start without -O gets, so a
      plain start is never refused.
    - `apply_config_defaults` fills this platform's defaults in the EngineConfig (the -O
      level; `set_default`, so an explicit user flag stays), once, before the plugins'
      `core_adjust_config` hooks; `check_config` then refuses, once every default is
      filled and with no side effects, what this platform cannot run (ValueError naming
      the flag).
    - Device ids have three namespaces: logical (the engine's local rank), physical
      (the id the driver and topology tools use) and visible (the index torch sees
      after `device_control_env_var`, e.g. CUDA_VISIBLE_DEVICES, remapped them).
    - `memory_profiling`: the device's memory is the engine's alone, so the KV cache gets
      --gpu-memory-utilization x total memory minus the peak of a profiled forward of the
      largest batch (`reset_peak_memory` / `peak_memory_bytes`, which such a platform
      must support). False: memory shared with the host; the KV cache gets a fraction of
      what is available (core.kv_cache.budget) and --gpu-memory-utilization is refused.
    - `pin_memory`: the runner stages its per-step inputs in pinned (page-locked) host
      memory and copies them to the device without blocking; False where that buys
      nothing (the CPU, where the inputs need no copy at all).
    """

    name: ClassVar[str]
    device_type: ClassVar[str]
    device_name: ClassVar[str]
    dist_backend: ClassVar[str]
    device_communicator_cls: ClassVar[type[DeviceCommunicator]] = DeviceCommunicator
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]]
    supported_quantization: ClassVar[tuple[str, ...]] = ()
    preferred_attention_backends: ClassVar[tuple[str, ...]]
    preferred_sampler: ClassVar[str] = "default"
    device_control_env_var: ClassVar[str | None] = None
    memory_profiling: ClassVar[bool] = False
    pin_memory: ClassVar[bool] = False
    # Eager unless a platform says it compiles (-O1) or captures graphs (-O2,
    # `capture_graph`).
    supported_optimization_levels: ClassVar[tuple[int, ...]] = (0,)
    default_optimization_level: ClassVar[int] = 0
    # Whether its kernels serve batch-invariant mode (core.batch_invariant): a platform
    # says so once every op its kernels serve keeps a row's sums independent of the batch.
    batch_invariant: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # check_and_update_config was split in two: an override of it would never be
        # called, so a platform written for it fails loudly instead of running unchecked.
        if "check_and_update_config" in vars(cls):
            raise TypeError(
                f"{cls.__qualname__}.check_and_update_config is no longer called: fill "
                "defaults in apply_config_defaults and refuse in check_config"
            )

    def __init__(self) -> None:
        self._assigned_physical_ids: tuple[int, ...] | None = None
        # Memory outside torch's allocator when the peak measurement began.
        self._non_torch_baseline_bytes: int | None = None

    @property
    def default_dtype(self) -> torch.dtype:
        return self.supported_dtypes[0]

    @property
    def default_dtype_reason(self) -> str:
        """Why `default_dtype` is what it is, for `core info` and the engine's start log."""
        return f"the first of the {self.name} platform's supported dtypes"

    def default_max_num_batched_tokens(self, usage: UsageContext) -> int:
        """The per-step token budget when the user sets none (with chunked prefill).

        Larger budgets make prefill matmuls more efficient; smaller ones bound how long a
        step carrying prefill chunks stalls the requests decoding beside it.
        """
        return DEFAULT_MAX_NUM_BATCHED_TOKENS

    def default_burst_token_budget(self, usage: UsageContext) -> int | None:
        """When the user sets no token budget: the most tokens a step may take, its steps
        then sized from measured step times (SchedulerConfig.burst_token_budget,
        core/scheduler/step_budget.py); None: every step keeps the fixed budget. At least
        `default_max_num_batched_tokens(usage)` where not None."""
        return None

    def torch_device(self, local_rank: int = 0) -> torch.device:
        """The torch device a worker of `local_rank` computes on."""
        return torch.device(self.device_type, self.logical_to_visible(local_rank))

    def device_count(self) -> int | None:
        """How many devices this host lets the engine use (after `device_control_env_var`);
        None when ranks share the host's one device (the CPU)."""
        return None

    @abstractmethod
    def memory_info(self) -> MemoryInfo:
        """Total and currently available memory of one device, in bytes."""

    def zeroed_bytes(self, num_bytes: int, device: torch.device) -> torch.Tensor:
        """A zero-filled int8 tensor of `num_bytes` on `device`: the KV cache's storage,
        which the layers view in their own dtypes and shapes. Zeros, so that no padded or
        masked read of a slot not yet written meets a NaN."""
        return torch.zeros(num_bytes, dtype=torch.int8, device=device)

    def capture_graph(self, fn: Callable[[], Any]) -> DeviceGraph:
        """Record `fn` into a device graph (core.platforms.device_graph); a platform that
        lists -O2 in `supported_optimization_levels` implements it."""
        raise NotImplementedError(f"the {self.name} platform cannot capture device graphs")

    @abstractmethod
    def set_device(self, device: torch.device) -> None:
        """Make `device` the current device of this process."""

    def apply_config_defaults(self, config: Any) -> None:
        """Fill this platform's defaults in `config` (an EngineConfig) where the user set
        nothing: the -O level. An override calls super() and uses `set_default`."""
        config.compilation.set_default("level", self.default_optimization_level)

    def check_config(self, config: Any) -> None:
        """Refuse, naming the flag, what this platform cannot run in `config` (an
        EngineConfig whose defaults are all filled): dtype, quantization method, -O level,
        compilation, device count, --gpu-memory-utilization. Changes nothing. An override
        calls super()."""
        dtype = config.model.torch_dtype(self)
        if dtype not in self.supported_dtypes:
            supported = ", ".join(_dtype_name(d) for d in self.supported_dtypes)
            raise ValueError(
                f"--dtype {_dtype_name(dtype)} is not supported on the {self.name} platform: "
                f"use {supported}"
            )
        method = config.model.quantization
        if method not in (None, QUANTIZATION_NONE) and method not in self.supported_quantization:
            raise ValueError(
                f"--quantization {method} is not supported on the {self.name} platform"
            )
        if config.model.batch_invariant and not self.batch_invariant:
            raise ValueError(
                f"--batch-invariant: the {self.name} platform's kernels do not serve "
                "batch-invariant mode (the CPU platform's do)"
            )
        self._check_compilation(config.compilation)
        self._check_device_count(config.parallel)
        self._check_memory_profiling(config.cache)

    def _check_memory_profiling(self, cache: CacheConfig) -> None:
        """--gpu-memory-utilization is a share of a device this platform profiles."""
        if cache.is_user_set("gpu_memory_utilization") and not self.memory_profiling:
            raise ValueError(
                f"--gpu-memory-utilization: the {self.name} platform shares memory with the "
                "host and does not profile it; size the KV cache with --kv-cache-memory"
            )

    def _check_device_count(self, parallel: Any) -> None:
        """Refuse more ranks on this host than it has devices, naming the flags."""
        count = self.device_count()
        engines = len(parallel.local_data_parallel_ranks)
        needed = parallel.world_size * engines
        if count is not None and needed > count:
            raise ValueError(
                f"--tensor-parallel-size {parallel.tensor_parallel_size} x "
                f"--pipeline-parallel-size {parallel.pipeline_parallel_size} x "
                f"{engines} data-parallel engine cores on this node = {needed} ranks need "
                f"{needed} {self.name} devices; this host has {count}"
            )

    def _check_compilation(self, compilation: CompilationConfig) -> None:
        """Refuse a level, a compile or a graph capture (asked through
        --compilation-config) this platform cannot honour; --enforce-eager turns both off."""
        supported = self.supported_optimization_levels
        names = ", ".join(f"-O{level}" for level in supported)
        if compilation.level not in supported:
            raise ValueError(
                f"-O{compilation.level} {_LEVEL_NEEDS[compilation.level]}; "
                f"the {self.name} platform supports {names}"
            )
        for key, level in (
            ("compile_model", COMPILE_LEVEL),
            ("capture_graphs", GRAPH_CAPTURE_LEVEL),
        ):
            if getattr(compilation, key) and level not in supported:
                raise ValueError(
                    f"compilation_config.{key} {_LEVEL_NEEDS[level]}; "
                    f"the {self.name} platform supports {names}"
                )

    # -- memory profiling (memory_profiling platforms) ----------------------------------------

    def reset_peak_memory(self) -> None:
        """Begin a peak-memory measurement of this process on its current device: from
        now on `peak_memory_bytes` reports this window's peak. Frees torch's cached blocks
        first, so that what torch holds is what its tensors use.

        The default reads torch.accelerator's device-generic statistics (CUDA, ROCm,
        XPU...); a platform whose runtime torch does not track overrides both methods.
        """
        torch.accelerator.empty_cache()
        torch.accelerator.reset_peak_memory_stats()
        self._non_torch_baseline_bytes = _non_torch_bytes()

    def peak_memory_bytes(self) -> int:
        """The most memory this process held on its device since `reset_peak_memory`:
        its tensors at their peak (the weights, alive throughout, included) plus what was
        allocated outside torch's allocator since the reset (runtime and library
        workspaces, communication buffers), as seen now."""
        if self._non_torch_baseline_bytes is None:
            raise RuntimeError("peak_memory_bytes: reset_peak_memory must run first")
        non_torch = max(0, _non_torch_bytes() - self._non_torch_baseline_bytes)
        return torch.accelerator.max_memory_allocated() + non_torch

    # -- device-id namespaces ----------------------------------------------------------------

    def set_assigned_physical_ids(self, physical_ids: tuple[int, ...]) -> None:
        """Pin the physical devices of this process (e.g. given by Ray); set once."""
        if self._assigned_physical_ids not in (None, physical_ids):
            raise RuntimeError(
                f"physical device ids already assigned as {self._assigned_physical_ids}, "
                f"cannot reassign to {physical_ids}"
            )
        self._assigned_physical_ids = physical_ids

    def logical_to_physical(self, logical_id: int) -> int:
        if self._assigned_physical_ids is not None:
            return self._assigned_physical_ids[logical_id]
        visible = self._visible_ids()
        return visible[logical_id] if visible is not None else logical_id

    def logical_to_visible(self, logical_id: int) -> int:
        physical = self.logical_to_physical(logical_id)
        visible = self._visible_ids()
        if visible is None:
            return physical
        if physical not in visible:
            raise RuntimeError(
                f"physical device {physical} is not in {self.device_control_env_var}={visible}"
            )
        return visible.index(physical)

    def _visible_ids(self) -> list[int] | None:
        # An empty value counts as unset: Ray sets it so for CPU-only placement groups.
        raw = os.environ.get(self.device_control_env_var or "", "")
        return [int(x) for x in raw.split(",") if x.strip()] if raw.strip() else None


def _non_torch_bytes() -> int:
    """Device memory in use that torch's allocator does not hold: the runtime's and
    libraries' own allocations, and other processes' (constant while we measure)."""
    free, total = torch.accelerator.get_memory_info()
    return total - free - torch.accelerator.memory_reserved()


def _dtype_name(dtype: torch.dtype) -> str:
    """The --dtype spelling of a torch dtype ("bfloat16")."""
    return str(dtype).removeprefix("torch.")
