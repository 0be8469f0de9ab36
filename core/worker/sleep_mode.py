"""Sleep mode, the worker's side (vLLM's `--enable-sleep-mode`): its weights and KV cache
leave its memory and come back, every tensor keeping its identity.

Level 1 keeps the weights' bytes outside the worker's memory and restores them to the bit;
level 2 forgets them, and waking reloads them from the checkpoint. Both forget the KV
cache: the engine core resets its prefix cache, so no block's content is trusted after.

Each storage is emptied in place and refilled in place, so every view of it stays valid
without being found: the model's parameters and buffers, the attention layers' caches, a
kernel package's references. Only the bytes leave, and nothing may read the tensors until
they are back: the engine core runs no step while any part of a worker sleeps.

How a storage is emptied: one torch allocated is resized to nothing and regrown on wake;
the CPU platform's KV cache, a shared anonymous memory map (Platform.zeroed_bytes), has
its pages removed, and the kernel hands them out zeroed when touched again. The memory
freed then goes back to the system: on the CPU glibc's `malloc_trim` (without it glibc
kept SmolLM2-135M's freed 112 MB of weights and the worker's RSS did not move), on an
accelerator torch's cached blocks.

Where level 1 keeps the weights: on an accelerator in host memory, as vLLM does. On the
CPU, host memory is the worker's own memory, so in an unlinked temporary file in core's
cache directory: its pages belong to the kernel's page cache (written back, reclaimable),
not to the process. Re-reading the checkpoint, level 2's way, would also restore them, but
slower (the loader's conversions: GGUF's repacking) and as the checkpoint holds them, not
as memory held them. Measured on SmolLM2-135M's GGUF (112 MB of weights, 2-core EPYC):
level 1 sleeps in 0.2-0.3 s and wakes in 0.15 s; level 2 sleeps in 0.05 s and wakes in
1.9 s; both take the worker's RSS down by 121 MiB (the weights and the KV pages in use).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import mmap
import os
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.autograd.graph import increment_version

from core import envs

if TYPE_CHECKING:
    from core.config import EngineConfig

__all__ = [
    "KV_CACHE",
    "LEVELS",
    "TAGS",
    "WEIGHTS",
    "WorkerSleep",
    "check_enabled",
    "check_level",
    "check_sleep",
    "wake_tags",
]

logger = logging.getLogger(__name__)

WEIGHTS, KV_CACHE = "weights", "kv_cache"
TAGS = (WEIGHTS, KV_CACHE)  # what `wake_up` may restore one at a time (vLLM's tags)
LEVELS = (1, 2)


def check_level(level: object) -> None:
    """ValueError naming level unless it is 1 (offload the weights) or 2 (drop them)."""
    if type(level) is not int or level not in LEVELS:
        raise ValueError(f"level must be 1 (offload the weights) or 2 (drop them), got {level!r}")


def check_enabled(config: EngineConfig) -> None:
    """ValueError naming enable_sleep_mode unless the engine started with it."""
    if not config.model.enable_sleep_mode:
        raise ValueError(
            "enable_sleep_mode: this engine was started without sleep mode; start it with "
            "--enable-sleep-mode (LLM(..., enable_sleep_mode=True))"
        )


def check_sleep(config: EngineConfig, level: object) -> None:
    """ValueError, before anything sleeps, unless this engine may sleep at `level`: sleep
    mode on, a known level, and for level 2 no state a reload from the checkpoint would
    lose (the LoRA adapters in the model's slots, EPLB's placement of the experts)."""
    check_enabled(config)
    check_level(level)
    if level != 2:
        return
    lost = {"--enable-lora": config.lora is not None, "--enable-eplb": config.parallel.enable_eplb}
    for flag, on in lost.items():
        if on:
            raise ValueError(
                f"level 2 reloads the weights from the checkpoint, which would lose what "
                f"{flag} changed in them; use level 1"
            )


def wake_tags(tags: Sequence[str] | None) -> tuple[str, ...]:
    """The tags `wake_up` restores: `tags`, or every one for None; ValueError naming
    tags for any other name."""
    if tags is None:
        return TAGS
    unknown = [tag for tag in tags if tag not in TAGS]
    if isinstance(tags, str) or unknown:
        raise ValueError(f"tags must be a list of {list(TAGS)}, got {tags!r}")
    return tuple(dict.fromkeys(tags))


class WorkerSleep:
    """One worker's sleep: which of its parts are out of memory, and how each comes back.

    `model` holds the weights (its parameters and buffers); `kv_caches` gives the
    attention layers' cache views; `reload` builds the model again from its checkpoint,
    on the same device and dtype, for level 2's wake; `pin_memory`: level 1 keeps an
    accelerator's weights in pinned host memory. `sleep` and `wake_up` may be called in
    any order: a part already asleep stays as it is (level 2 after level 1 forgets the
    offloaded copy) and waking a part that is awake does nothing.
    """

    def __init__(
        self,
        model: nn.Module,
        kv_caches: Callable[[], Iterable[torch.Tensor]],
        reload: Callable[[], nn.Module],
        device: torch.device,
        pin_memory: bool = False,
    ) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.reload = reload
        self.device = device
        self.pin_memory = pin_memory
        self.weights: _Emptied | None = None  # set while the weights are out
        self.backup: _WeightBackup | None = None  # level 1's copy of them
        self.kv: _Emptied | None = None  # set while the KV cache is out

    def sleep(self, level: int) -> int:
        """Free the KV cache and offload (level 1) or drop (level 2) the weights; the bytes
        freed. ValueError naming level for another one."""
        check_level(level)
        freed = 0
        if self.kv is None:
            self.kv = _Emptied(
                _distinct_storages((str(i), t) for i, t in enumerate(self.kv_caches()))
            )
            freed += self.kv.empty()
        if self.weights is None:
            self.weights = _Emptied(_distinct_storages(_named_tensors(self.model)))
            if level == 1:
                self.backup = _backup_for(self.device, self.pin_memory)
                self.backup.save(self.weights.byte_views())
            freed += self.weights.empty()
        elif level == 2 and self.backup is not None:
            self.backup.discard()
            self.backup = None
        _return_freed_memory(self.device)
        logger.info("sleep level %d: freed %.1f MiB", level, freed / 2**20)
        return freed

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Bring back `tags` (all for None): the weights as they were (level 1) or as the
        checkpoint holds them (level 2), the KV cache zeroed."""
        tags = wake_tags(tags)
        if WEIGHTS in tags and self.weights is not None:
            if self.backup is not None:
                self.backup.restore(self.weights.regrow())
                self.backup = None
            else:
                self._reload_into(self.weights)
            self.weights = None
        if KV_CACHE in tags and self.kv is not None:
            self.kv.regrow(zeroed=True)
            self.kv = None
        _return_freed_memory(self.device)  # level 2's reloaded model

    def _reload_into(self, weights: _Emptied) -> None:
        """Level 2: each storage regrown and filled from the same storage of a model built
        anew from the checkpoint, which is freed as it goes (the peak: one model). Every
        weight then counts as written in place: whatever was derived from it (a kernel
        package's copy in its own layout) is made again, should the checkpoint differ."""
        fresh = _distinct_storages(_named_tensors(self.reload()))
        for name, view in weights.regrow_each():
            source = fresh.get(name)
            if source is None or source.untyped_storage().nbytes() != view.numel():
                raise RuntimeError(
                    f"wake_up: the checkpoint reloaded no longer matches the model ({name})"
                )
            view.copy_(_byte_view(source))
            if source.untyped_storage().resizable():
                source.untyped_storage().resize_(0)
        increment_version([tensor for _, tensor in _named_tensors(self.model)])


class _Emptied:
    """Storages emptied in place, each by one tensor viewing it, by name."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.tensors = tensors
        self.sizes = [t.untyped_storage().nbytes() for t in tensors.values()]

    def byte_views(self) -> list[torch.Tensor]:
        return [_byte_view(t) for t in self.tensors.values()]

    def empty(self) -> int:
        """Free every storage's bytes; how many."""
        for tensor in self.tensors.values():
            _empty(tensor.untyped_storage())
        return sum(self.sizes)

    def regrow(self, zeroed: bool = False) -> list[torch.Tensor]:
        """Every storage at its size again, with `zeroed` its bytes zero (else undefined;
        pages given back read as zeros either way); their byte views."""
        return [view for _, view in self.regrow_each(zeroed)]

    def regrow_each(self, zeroed: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
        """`regrow`, one storage at a time: each one's name and byte view."""
        for (name, tensor), size in zip(self.tensors.items(), self.sizes, strict=True):
            storage = tensor.untyped_storage()
            if storage.nbytes() != size:
                storage.resize_(size)
                if zeroed:
                    _byte_view(tensor).zero_()
            yield name, _byte_view(tensor)


def _named_tensors(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [*model.named_parameters(), *model.named_buffers()]


def _distinct_storages(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The first tensor of each distinct, non-empty storage among `named`, by name, in
    order (tied weights and fused shards share one)."""
    seen: set[int] = set()
    found: dict[str, torch.Tensor] = {}
    for name, tensor in named:
        address = tensor.untyped_storage().data_ptr()
        if address and address not in seen:
            seen.add(address)
            found[name] = tensor
    return found


def _byte_view(tensor: torch.Tensor) -> torch.Tensor:
    """Every byte of `tensor`'s storage: uint8 [nbytes]."""
    # set_ keeps the storage resizable, which numpy() or frombuffer would not.
    return torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(tensor.untyped_storage())


def _empty(storage: torch.UntypedStorage) -> None:
    """Free `storage`'s bytes in place: resized to nothing, or, for a memory map torch did
    not allocate (the CPU KV cache), its pages given back to the kernel."""
    if storage.resizable():
        storage.resize_(0)
    elif storage.device.type == "cpu":
        _remove_pages(storage.data_ptr(), storage.nbytes())
    else:
        raise RuntimeError(f"sleep: cannot free a {storage.device} storage torch did not allocate")


def _remove_pages(address: int, length: int) -> None:
    """Give a mapping's pages back (they read as zeros after): MADV_REMOVE frees a shared
    mapping's backing memory, which MADV_DONTNEED would only unmap; DONTNEED frees a
    private one's."""
    libc = _libc()
    for advice in (mmap.MADV_REMOVE, mmap.MADV_DONTNEED):
        if libc.madvise(ctypes.c_void_p(address), ctypes.c_size_t(length), advice) == 0:
            return
    raise OSError(ctypes.get_errno(), f"sleep: madvise failed: {os.strerror(ctypes.get_errno())}")


def _return_freed_memory(device: torch.device) -> None:
    """Hand memory the freed tensors leave to the system: glibc keeps freed heap pages
    mapped until trimmed; an accelerator's torch allocator caches freed blocks."""
    if device.type != "cpu":
        torch.accelerator.empty_cache()
        return
    trim = getattr(_libc(), "malloc_trim", None)  # glibc's; other C libraries return pages
    if trim is not None:
        trim(0)


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc


class _WeightBackup(ABC):
    """Where level 1 keeps the weights' bytes while their storages are empty."""

    @abstractmethod
    def save(self, views: list[torch.Tensor]) -> None:
        """Copy these byte views (uint8, one per storage) out."""

    @abstractmethod
    def restore(self, views: list[torch.Tensor]) -> None:
        """Copy the bytes back into these views (the same storages, regrown), then free
        the copy."""

    @abstractmethod
    def discard(self) -> None:
        """Free the copy without restoring it."""


class _HostBackup(_WeightBackup):
    """An accelerator's weights in host memory, pinned for fast copies back."""

    def __init__(self, pin_memory: bool) -> None:
        self.pin_memory = pin_memory
        self.copies: list[torch.Tensor] = []

    def save(self, views: list[torch.Tensor]) -> None:
        self.copies = [
            torch.empty(v.numel(), dtype=torch.uint8, pin_memory=self.pin_memory).copy_(v)
            for v in views
        ]

    def restore(self, views: list[torch.Tensor]) -> None:
        for view, copy in zip(views, self.copies, strict=True):
            view.copy_(copy)
        self.discard()

    def discard(self) -> None:
        self.copies = []


class _FileBackup(_WeightBackup):
    """The CPU's weights in an unlinked temporary file, gone with the process whatever
    happens. Written and read with plain file I/O: the bytes go through the page cache,
    never through pages of this process (a shared mapping of the file took 1.8 s of page
    faults for SmolLM2-135M's 112 MB where `write` takes 0.2 s)."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.file = tempfile.TemporaryFile(prefix="core-sleep-", dir=directory)

    def save(self, views: list[torch.Tensor]) -> None:
        for view in views:
            self.file.write(_buffer(view))
        self.file.flush()

    def restore(self, views: list[torch.Tensor]) -> None:
        self.file.seek(0)
        for view in views:
            if self.file.readinto(_buffer(view)) != view.numel():
                raise RuntimeError("wake_up: the weights' file was cut short")
        self.discard()

    def discard(self) -> None:
        self.file.close()


def _buffer(view: torch.Tensor) -> ctypes.Array:
    """A CPU byte view's memory as a buffer, without a copy (numpy() would do it too, but
    would leave the storage unresizable for good)."""
    return (ctypes.c_char * view.numel()).from_address(view.data_ptr())


def _backup_for(device: torch.device, pin_memory: bool) -> _WeightBackup:
    if device.type == "cpu":
        return _FileBackup(envs.cache_dir() / "sleep")
    return _HostBackup(pin_memory)
