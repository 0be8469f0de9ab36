"""`offload`: a prefix cache behind the KV pool, in host memory and then on disk.

    --kv-transfer-config '{"kv_connector": "offload", "kv_role": "kv_both",
        "kv_connector_extra_config": {"num_cpu_blocks": 4096,
                                      "disk_path": "/var/cache/core-kv", "num_disk_blocks": 65536}}'

Every block a step fills is copied, after the step's forward, into a host-memory slot
(write-through: the pool may evict it any time after). The host tier is an LRU of
`num_cpu_blocks` slots; a slot it evicts is spilled to the disk tier first when
`disk_path` is set (an LRU of `num_disk_blocks` files; `block_files.py`: atomic, checksummed).
Blocks are keyed by the engine's chained block hash (prompt tokens, the LoRA adapter and
cache salt included) under a directory named for what makes KV interchangeable (model,
dtype, block size, KV dtype, hash algorithm, core version), so engines of one model on one
host share the disk tier, and a restarted engine finds it again.

A request whose prompt blocks are stored (past its local prefix-cache hit) loads them
asynchronously: its blocks are allocated, the workers copy them in at the start of the
next step and report it done; only then is it scheduled, computing the rest of its prompt.
A block file that fails its checks fails the load and the request recomputes its prompt.

The scheduler role decides everything (which slot, what to spill, what to delete); the
worker role only moves bytes as the step's metadata says, so the two never disagree.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from core import __version__
from core.config import EngineConfig
from core.kv_transfer.interface import (
    KVConnector,
    KVConnectorMetadata,
    KVConnectorOutput,
    KVConnectorRole,
)
from core.request import Request
from core.worker.contract import SchedulerOutput
from core_kv_connectors.block_files import BlockFileError, block_path, read_block, write_block

logger = logging.getLogger(__name__)

_KEYS = ("num_cpu_blocks", "disk_path", "num_disk_blocks")


# Host slots when the config names none (a block of SmolLM2-135M in float32 is 720 KiB).
DEFAULT_CPU_BLOCKS = 256


@dataclass(frozen=True)
class OffloadOptions:
    num_cpu_blocks: int = DEFAULT_CPU_BLOCKS
    disk_path: Path | None = None
    num_disk_blocks: int = 0

    @classmethod
    def from_config(cls, config: EngineConfig) -> OffloadOptions:
        extra = config.kv_transfer.kv_connector_extra_config
        unknown = sorted(set(extra) - set(_KEYS))
        if unknown:
            raise ValueError(f"kv_connector_extra_config: unknown keys {unknown} (offload takes "
                             f"{list(_KEYS)})")  # fmt: skip
        options = cls(
            num_cpu_blocks=_count(extra, "num_cpu_blocks", DEFAULT_CPU_BLOCKS),
            disk_path=Path(extra["disk_path"]) if extra.get("disk_path") else None,
            num_disk_blocks=_count(
                extra, "num_disk_blocks", 1 << 16 if "disk_path" in extra else 0
            ),
        )
        if options.num_cpu_blocks < 1:
            raise ValueError("kv_connector_extra_config.num_cpu_blocks: offload needs >= 1 host "
                             "block (the disk tier is filled from the host tier)")  # fmt: skip
        return options


def _count(extra: dict[str, Any], key: str, default: int = 0) -> int:
    value = extra.get(key, default)
    if type(value) is not int or value < 0:
        raise ValueError(f"kv_connector_extra_config.{key} must be an integer >= 0, got {value!r}")
    return value


def rank_dir(root: Path, rank: int) -> Path:
    """Where tensor-parallel rank `rank` keeps its share (its KV heads) of every block."""
    return root / f"rank{rank}"


def interchange_key(config: EngineConfig) -> str:
    """What must match for two engines' blocks to be interchangeable, as a directory name."""
    facts = {
        "model": config.model.model,
        "revision": config.model.revision,
        "dtype": config.model.dtype,
        "quantization": config.model.quantization,
        "block_size": config.cache.block_size,
        "kv_cache_dtype": config.cache.kv_cache_dtype,
        "tensor_parallel_size": config.parallel.tensor_parallel_size,
        "hash": config.cache.prefix_caching_hash_algo,
        "core": __version__,
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:32]


@dataclass
class OffloadMetadata(KVConnectorMetadata):
    """One step's moves, in the order the worker makes them."""

    # Before the forward: (request id, block id, host slot or None, block hash): a slot
    # copies from host memory, None reads the block's file.
    loads: list[tuple[str, int, int | None, str]] = field(default_factory=list)
    # After the forward: a slot's block to its file before the slot is reused...
    spills: list[tuple[int, str]] = field(default_factory=list)
    # ... then (block id, host slot): the step's newly full blocks into host memory...
    saves: list[tuple[int, int]] = field(default_factory=list)
    # ... then the files the disk tier evicted.
    deletes: list[str] = field(default_factory=list)


@dataclass
class _Tracked:
    """A running request's blocks as the scheduler gave them, and how many are stored."""

    request: Request
    block_ids: list[int]
    num_stored: int


class OffloadConnector(KVConnector):
    def __init__(self, config: EngineConfig, role: KVConnectorRole) -> None:
        super().__init__(config, role)
        self.options = OffloadOptions.from_config(config)
        self.block_size = config.cache.block_size
        root = self.options.disk_path
        self.root = None if root is None else root / interchange_key(config)
        if role is KVConnectorRole.SCHEDULER:
            self._init_scheduler()
        else:
            self._init_worker()

    # -- scheduler role --------------------------------------------------------------------

    def _init_scheduler(self) -> None:
        self._host: OrderedDict[str, int] = OrderedDict()  # hash -> slot, oldest first
        self._free_slots = list(range(self.options.num_cpu_blocks - 1, -1, -1))
        self._disk: OrderedDict[str, None] = OrderedDict()  # hashes with a file, oldest first
        num_ranks = self.config.parallel.tensor_parallel_size
        self._rank_dirs = (
            [] if self.root is None else [rank_dir(self.root, r) for r in range(num_ranks)]
        )
        if self._rank_dirs and self._rank_dirs[0].is_dir():
            files = sorted(self._rank_dirs[0].glob("*/*.kv"), key=lambda p: p.stat().st_mtime)
            self._disk.update((p.stem, None) for p in files if self._on_disk(p.stem))
        self._tracked: dict[str, _Tracked] = {}
        self._loading: dict[str, list[str]] = {}  # request id -> the keys its load reads
        self._step = OffloadMetadata()

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int, bool]:
        start = num_computed_tokens // self.block_size
        usable = (request.num_tokens - 1) // self.block_size  # the last token is computed
        count = 0
        for block_hash in request.block_hashes[start:usable]:
            if not self._stored(block_hash.hex()):
                break
            count += 1
        return count * self.block_size, count > 0

    def _stored(self, key: str) -> bool:
        if key in self._host or key in self._disk:
            return True
        # Another engine sharing the directory may have written it.
        if self._rank_dirs and self._on_disk(key):
            self._disk[key] = None
            return True
        return False

    def _on_disk(self, key: str) -> bool:
        """Whether every rank's share of `key`'s block has its file."""
        return all(block_path(directory, key).is_file() for directory in self._rank_dirs)

    def update_state_after_alloc(
        self, request: Request, block_ids: tuple[list[int], ...], num_external_tokens: int
    ) -> None:
        ids = list(block_ids[0])
        first = request.num_computed_tokens // self.block_size
        num_loaded = num_external_tokens // self.block_size
        for index in range(first, first + num_loaded):
            key = request.block_hashes[index].hex()
            slot = self._host.get(key)
            if slot is not None:
                self._host.move_to_end(key)
            elif key in self._disk:
                self._disk.move_to_end(key)
            self._step.loads.append((request.request_id, ids[index], slot, key))
            self._loading.setdefault(request.request_id, []).append(key)
        self._tracked[request.request_id] = _Tracked(request, ids, first + num_loaded)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        self._follow_blocks(scheduler_output)
        for req_id in scheduler_output.num_scheduled_tokens:
            tracked = self._tracked.get(req_id)
            if tracked is not None:
                self._store_full_blocks(tracked)
        step, self._step = self._step, OffloadMetadata()
        return step

    def _follow_blocks(self, scheduler_output: SchedulerOutput) -> None:
        """The block ids the step gave tracked requests (appended, or all on a resume)."""
        for new in scheduler_output.scheduled_new_reqs:
            if new.req_id in self._tracked:
                self._tracked[new.req_id].block_ids = list(new.block_ids[0])
        cached = scheduler_output.scheduled_cached_reqs
        for req_id, resumed, new_ids in zip(
            cached.req_ids, cached.resumed_from_preemption, cached.new_block_ids, strict=True
        ):
            tracked = self._tracked.get(req_id)
            if tracked is None or new_ids is None:
                continue
            if resumed:
                tracked.block_ids, tracked.num_stored = list(new_ids[0]), 0
            else:
                tracked.block_ids += new_ids[0]

    def _store_full_blocks(self, tracked: _Tracked) -> None:
        """Save each block the request's computed tokens now fill that is not stored."""
        request = tracked.request
        num_full = min(request.num_computed_tokens // self.block_size, len(request.block_hashes))
        for index in range(tracked.num_stored, num_full):
            key = request.block_hashes[index].hex()
            if key in self._host:
                self._host.move_to_end(key)
                continue
            self._step.saves.append((tracked.block_ids[index], self._take_slot(key)))
        tracked.num_stored = max(tracked.num_stored, num_full)

    def _take_slot(self, key: str) -> int:
        """A host slot for `key`: a free one, else the oldest's, spilled to disk first."""
        if self._free_slots:
            slot = self._free_slots.pop()
        else:
            old_key, slot = self._host.popitem(last=False)
            if self.root is not None and old_key not in self._disk:
                self._step.spills.append((slot, old_key))
                self._add_to_disk(old_key)
        self._host[key] = slot
        return slot

    def _add_to_disk(self, key: str) -> None:
        self._disk[key] = None
        while len(self._disk) > self.options.num_disk_blocks:
            old_key, _ = self._disk.popitem(last=False)
            self._step.deletes.append(old_key)

    def update_connector_output(self, output: KVConnectorOutput) -> None:
        """Forget the blocks of failed loads (the worker deleted their files), so no later
        request is offered them."""
        for req_id in output.finished_recving:
            keys = self._loading.pop(req_id, [])
            if req_id not in output.failed_recving:
                continue
            for key in keys:
                slot = self._host.pop(key, None)
                if slot is not None:
                    self._free_slots.append(slot)
                self._disk.pop(key, None)

    def request_finished(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        # Saves run within the step that filled a block: nothing is in flight.
        self._tracked.pop(request.request_id, None)
        return False, None

    # -- worker role -----------------------------------------------------------------------

    def _init_worker(self) -> None:
        self._caches: list[torch.Tensor] = []  # per layer: [num_blocks, *page_shape]
        self._host_blocks: torch.Tensor | None = None  # [num_cpu_blocks, num_layers, *page]
        self._report = KVConnectorOutput()  # what get_finished hands over next
        self._files: Path | None = None  # this rank's directory of the disk tier

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        # Sorted by name: every engine of the model lays a block's file out alike.
        self._caches = [kv_caches[name] for name in sorted(kv_caches)]
        first = self._caches[0]
        if any(c.shape[1:] != first.shape[1:] or c.dtype != first.dtype for c in self._caches):
            raise ValueError("offload: every attention layer must share one page shape and dtype")
        shape = (self.options.num_cpu_blocks, len(self._caches), *first.shape[1:])
        self._host_blocks = torch.empty(shape, dtype=first.dtype)
        self._files = None if self.root is None else rank_dir(self.root, self.rank)

    @property
    def _block_shape(self) -> tuple[int, ...]:
        assert self._host_blocks is not None
        return tuple(self._host_blocks.shape[1:])

    def start_load_kv(self, forward_context: Any) -> None:
        for req_id, block_id, slot, key in self._meta().loads:
            start = time.perf_counter()
            self._report.finished_recving.add(req_id)
            try:
                block = self._host_block(slot) if slot is not None else self._disk_block(key)
            except BlockFileError as exc:
                logger.warning("offload: %s; request %s recomputes its prompt", exc, req_id)
                if self._files is not None:  # no engine sharing the directory reads it again
                    block_path(self._files, key).unlink(missing_ok=True)
                self._report.failed_recving.add(req_id)
                continue
            for layer, cache in enumerate(self._caches):
                cache[block_id].copy_(block[layer])
            self._count(1, start)

    def _host_block(self, slot: int) -> torch.Tensor:
        assert self._host_blocks is not None
        return self._host_blocks[slot]

    def _disk_block(self, key: str) -> torch.Tensor:
        if self._files is None:
            raise BlockFileError(f"block {key}: no disk tier")
        assert self._host_blocks is not None
        return read_block(block_path(self._files, key), self._block_shape, self._host_blocks.dtype)

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any) -> None:
        """Saves wait for the whole forward (`wait_for_save`): a block is one file of every
        layer, and the host copy of a CPU cache is a memcpy the forward would not overlap."""

    def wait_for_save(self) -> None:
        meta = self._meta()
        assert self._host_blocks is not None
        start = time.perf_counter()
        for slot, key in meta.spills:
            assert self._files is not None
            write_block(block_path(self._files, key), self._host_blocks[slot])
        for block_id, slot in meta.saves:
            for layer, cache in enumerate(self._caches):
                self._host_blocks[slot, layer].copy_(cache[block_id])
        if meta.spills or meta.saves:
            self._count(len(meta.spills) + len(meta.saves), start)
        for key in meta.deletes:
            assert self._files is not None
            block_path(self._files, key).unlink(missing_ok=True)

    def _count(self, num_blocks: int, start: float) -> None:
        assert self._host_blocks is not None
        block_bytes = self._host_blocks[0].numel() * self._host_blocks.element_size()
        self._report.count_moved(num_blocks, num_blocks * block_bytes, time.perf_counter() - start)

    def get_finished(self, finished_req_ids: set[str]) -> KVConnectorOutput:
        output, self._report = self._report, KVConnectorOutput()
        return output

    def _meta(self) -> OffloadMetadata:
        meta = self.connector_metadata
        if not isinstance(meta, OffloadMetadata):
            raise TypeError(f"offload: expected OffloadMetadata, got {type(meta).__name__}")
        return meta
