"""The KVConnector interface: moving KV-cache blocks between engines (P/D disaggregation).

One connector class runs in two roles. The SCHEDULER role lives beside the scheduler in
the engine-core process: it says how many prompt tokens an external store can provide,
learns which blocks were allocated for them, and emits per-step metadata. The WORKER
role lives in every worker: it receives that metadata, loads and saves KV per layer
around the forward, and reports which requests finished sending or receiving.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import torch


class KVConnectorRole(str, enum.Enum):
    SCHEDULER = "scheduler"
    WORKER = "worker"


@dataclass
class KVConnectorMetadata:
    """Scheduler -> worker, once per step: what to load and save.

    Connectors subclass it with their own fields; it travels inside SchedulerOutput.
    """


@dataclass
class KVConnectorOutput:
    """Worker -> scheduler, once per step: transfers that completed.

    A failed receive is also reported in `finished_recving`, so the scheduler never
    waits for it forever; `failed_recving` tells it to recompute those tokens instead.
    """

    finished_sending: set[str] = field(default_factory=set)
    finished_recving: set[str] = field(default_factory=set)
    failed_recving: set[str] = field(default_factory=set)
    # What moved since the last call (loads, saves and sends alike), for the metrics:
    # totals, and each transfer's seconds (the transfer-time histogram's observations).
    num_blocks_moved: int = 0
    num_bytes_moved: int = 0
    transfer_times: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.finished_recving |= self.failed_recving

    def count_moved(self, num_blocks: int, num_bytes: int, seconds: float) -> None:
        """Add one transfer to what moved."""
        self.num_blocks_moved += num_blocks
        self.num_bytes_moved += num_bytes
        self.transfer_times.append(seconds)

    def add(self, other: KVConnectorOutput) -> None:
        """Take in the report of another connector of the same worker (a composite's)."""
        self.finished_sending |= other.finished_sending
        self.finished_recving |= other.finished_recving
        self.failed_recving |= other.failed_recving
        self.num_blocks_moved += other.num_blocks_moved
        self.num_bytes_moved += other.num_bytes_moved
        self.transfer_times += other.transfer_times


class KVConnector(ABC):
    """Base class of KV connectors (`core.kv_connectors` entry points).

    Constructed as `cls(config, role)` in each role's process (the EngineConfig: its
    `kv_transfer.kv_connector_extra_config` holds the connector's own keys); methods of
    the other role are never called on an instance.

    The scheduler role sees every admitted request: `update_state_after_alloc` follows
    each admission (with 0 external tokens too; `request.num_computed_tokens` is then
    the local prefix-cache hit, the external tokens start there), `build_connector_meta`
    each step (after the step's tokens are counted as computed), `request_finished` each
    request that leaves. External tokens start at a block boundary (the local hit's end)
    and end at one or at the prompt's last token, which the scheduler keeps to compute.
    An asynchronous load must be reported in `get_finished`'s `finished_recving` (its
    `failed_recving` too when it failed) of a later step; until then the request waits
    and its blocks stay allocated and out of the prefix cache.
    The worker role is called around every step: metadata bound, `start_load_kv` before
    the step's inputs are prepared (with an empty forward context; on steps with nothing
    to forward too), per attention layer `wait_for_layer_load` before and `save_kv_layer`
    after the layer's KV is written, `wait_for_save` after the step's sampling, then
    `get_finished`.
    Under tensor parallelism each rank has a worker-role instance: `rank` (the worker's
    global rank, 0 in the scheduler role) is set before `register_kv_caches`, whose caches
    then hold the rank's KV heads only; a connector keys what it keeps per rank (files,
    ports) by it. Each rank reports its own transfers; the scheduler sees one report where
    a transfer is done once every rank reported it (core/kv_transfer/aggregator.py).
    """

    def __init__(self, config: Any, role: KVConnectorRole) -> None:
        self.config = config
        self.role = role
        self.rank = 0
        self._metadata: KVConnectorMetadata | None = None

    # -- scheduler role --------------------------------------------------------------------

    @abstractmethod
    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int, bool]:
        """(tokens beyond `num_computed_tokens` the external store can provide, whether
        they arrive asynchronously — the request then waits for remote KV)."""

    @abstractmethod
    def update_state_after_alloc(
        self, request: Any, block_ids: tuple[list[int], ...], num_external_tokens: int
    ) -> None:
        """Blocks were allocated for `request`; remember where its external tokens go."""

    @abstractmethod
    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        """This step's metadata for the workers; resets the per-step state."""

    def update_connector_output(self, output: KVConnectorOutput) -> None:
        """The workers' report of a step, as the scheduler received it: a connector that
        offers stored KV must stop offering what a failed load (`failed_recving`) could
        not bring. Default: nothing to learn."""

    def request_finished(
        self, request: Any, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        """(whether the blocks must stay allocated until sending finishes, transfer
        parameters to return to the client). Default: free at once, nothing to return."""
        return False, None

    # -- worker role -----------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """The worker's KV-cache views, by layer name, once after allocation."""

    def bind_connector_metadata(self, metadata: KVConnectorMetadata) -> None:
        self._metadata = metadata

    def clear_connector_metadata(self) -> None:
        self._metadata = None

    @property
    def connector_metadata(self) -> KVConnectorMetadata:
        if self._metadata is None:
            raise RuntimeError("no connector metadata is bound for this step")
        return self._metadata

    @abstractmethod
    def start_load_kv(self, forward_context: Any) -> None:
        """Begin loading this step's external KV into the paged cache (may be async)."""

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Block until `layer_name`'s KV is loaded; default: loads are synchronous."""

    @abstractmethod
    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any) -> None:
        """Start saving `layer_name`'s new KV for requests this step marks to save."""

    def wait_for_save(self) -> None:
        """Block until every save of this step is done; default: saves are synchronous."""

    def get_finished(self, finished_req_ids: set[str]) -> KVConnectorOutput:
        """Transfers completed since the last call; default: synchronous, none pending."""
        return KVConnectorOutput()

    def shutdown(self) -> None:
        """Release what the worker role holds (listening sockets, threads, connections)
        when its engine stops, though the process may go on (an in-process engine, a
        test); called once, after the last step. Default: nothing to release."""
