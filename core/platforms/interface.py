"""The Platform interface: what core needs to know about one kind of hardware.

A platform plugin registers, in the `core.platforms` group, a cheap zero-argument probe
that returns the dotted path of its Platform subclass when the machine can run it and
returns None or raises `Unavailable(reason)` when it cannot. The probe must not
initialise a device runtime; the class itself is imported only when chosen.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from core.config import DEFAULT_MAX_NUM_BATCHED_TOKENS, UsageContext


class Unavailable(Exception):
    """Raised by a platform probe: this platform cannot run here, and why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class MemoryInfo:
    total_bytes: int
    available_bytes: int


class Platform(ABC):
    """One kind of device: its identity, memory, defaults and preferred components.

    Contract:
    - `device_type` is the torch device type ("cpu", "cuda", ...); `device_name` a
      human-readable name; `dist_backend` the torch.distributed backend to use.
    - `supported_dtypes` lists the model dtypes it runs, the first one being the
      default; `supported_quantization` the quantization method names it accepts.
    - `preferred_attention_backends` and `preferred_sampler` name entry points, in
      order of preference; the selectors walk them and fall back with a reason.
    - `check_and_update_config` validates and adjusts the EngineConfig before it is
      frozen (block size, dtype, optimization level); it raises ValueError for
      combinations this platform cannot run and never overrides an explicit user flag.
    - Device ids have three namespaces: logical (the engine's local rank), physical
      (the id the driver and topology tools use) and visible (the index torch sees
      after `device_control_env_var`, e.g. CUDA_VISIBLE_DEVICES, remapped them).
    """

    name: ClassVar[str]
    device_type: ClassVar[str]
    device_name: ClassVar[str]
    dist_backend: ClassVar[str]
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]]
    supported_quantization: ClassVar[tuple[str, ...]] = ()
    preferred_attention_backends: ClassVar[tuple[str, ...]]
    preferred_sampler: ClassVar[str] = "default"
    device_control_env_var: ClassVar[str | None] = None

    def __init__(self) -> None:
        self._assigned_physical_ids: tuple[int, ...] | None = None

    @property
    def default_dtype(self) -> torch.dtype:
        return self.supported_dtypes[0]

    def default_max_num_batched_tokens(self, usage: UsageContext) -> int:
        """The per-step token budget when the user sets none (with chunked prefill).

        Larger budgets make prefill matmuls more efficient; smaller ones bound how long a
        step carrying prefill chunks stalls the requests decoding beside it.
        """
        return DEFAULT_MAX_NUM_BATCHED_TOKENS

    def torch_device(self, local_rank: int = 0) -> torch.device:
        """The torch device a worker of `local_rank` computes on."""
        return torch.device(self.device_type, self.logical_to_visible(local_rank))

    @abstractmethod
    def memory_info(self) -> MemoryInfo:
        """Total and currently available memory of one device, in bytes."""

    @abstractmethod
    def set_device(self, device: torch.device) -> None:
        """Make `device` the current device of this process."""

    def worker_class(self) -> type:
        """The Worker class this platform runs (imported only when asked)."""
        from core.worker.worker import Worker

        return Worker

    def check_and_update_config(self, config: Any) -> None:
        """Validate `config` (an EngineConfig) for this platform and fill its defaults."""
        dtype = config.model.torch_dtype(self.default_dtype)
        if dtype not in self.supported_dtypes:
            supported = ", ".join(str(d).removeprefix("torch.") for d in self.supported_dtypes)
            raise ValueError(f"dtype {dtype} is not supported on {self.name}: use {supported}")
        parallel = config.parallel
        if parallel.tensor_parallel_size * parallel.pipeline_parallel_size > 1:
            raise ValueError(
                f"--tensor-parallel-size {parallel.tensor_parallel_size} / "
                f"--pipeline-parallel-size {parallel.pipeline_parallel_size}: only one worker "
                "per engine is supported so far; use 1"
            )
        method = config.model.quantization
        if method is not None and method not in self.supported_quantization:
            raise ValueError(f"quantization {method!r} is not supported on {self.name}")

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
