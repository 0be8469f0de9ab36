"""`p2p`: prefill/decode disaggregation, a prefill engine's KV pulled over TCP by a decode
engine (`core disagg-proxy` sends each request to one, then the other).

    prefill: --kv-transfer-config '{"kv_connector": "p2p", "kv_role": "kv_producer",
                                    "kv_connector_extra_config": {"kv_port": 14600}}'
    decode:  --kv-transfer-config '{"kv_connector": "p2p", "kv_role": "kv_consumer"}'

A request sent to the producer with kv_transfer_params {"do_remote_decode": true} keeps
its blocks when it finishes and answers where to fetch them (vLLM's keys: remote_host,
remote_port, remote_block_ids, remote_request_id, remote_engine_id, do_remote_prefill).
The decode engine, given those as the request's kv_transfer_params, allocates blocks for
the prompt's full blocks, reads them from the producer in a background thread (the
request waits meanwhile, others run), and computes only the rest of the prompt.

Failure handling (the reference's chapter 9): a handshake exchanges compatibility facts
(core version, model, dtype, block size, tensor-parallel size, layers, page shape) and a
mismatch is refused naming the first that differs; the producer holds sent blocks under a
lease (`lease_s`) that the consumer's heartbeats extend while its read waits, and frees
them on the consumer's DONE or when the lease expires, never while a read of them is under
way; a consumer's idle connections close after `peer_ttl_s`, busy ones never; a failed,
refused or timed-out read makes the decode engine recompute the prompt (never garbage,
never a hang). Under tensor parallelism rank r of the producer serves its KV heads on
kv_port + r and rank r of the consumer reads them from there. Wire format: p2p_wire.py.
"""

from __future__ import annotations

import logging
import socket
import socketserver
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
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
from core.request import Request, RequestStatus
from core.worker.contract import SchedulerOutput
from core_kv_connectors import p2p_wire as wire

logger = logging.getLogger(__name__)

_KEYS = {"kv_host": str, "kv_port": int, "lease_s": (int, float), "peer_ttl_s": (int, float),
         "timeout_s": (int, float)}  # fmt: skip
# How long a READ for a request the producer has not registered yet waits for it: the
# client may hear of the prefill before the producer's next step registers its blocks.
_REGISTER_WAIT_S = 5.0


@dataclass(frozen=True)
class P2POptions:
    kv_host: str = "127.0.0.1"  # where consumers reach this producer
    kv_port: int = 14600
    lease_s: float = 30.0  # how long a finished prefill's blocks wait for their reader
    peer_ttl_s: float = 120.0  # a consumer closes a producer connection idle this long
    timeout_s: float = 30.0  # connect and socket timeouts of a read

    @classmethod
    def from_config(cls, config: EngineConfig) -> P2POptions:
        extra = config.kv_transfer.kv_connector_extra_config
        for key, value in extra.items():
            if key not in _KEYS:
                raise ValueError(f"kv_connector_extra_config: unknown key {key!r} (p2p takes "
                                 f"{sorted(_KEYS)})")  # fmt: skip
            if not isinstance(value, _KEYS[key]) or isinstance(value, bool):
                raise ValueError(f"kv_connector_extra_config.{key}: {value!r} is not a "
                                 f"{key.split('_')[-1]} value")  # fmt: skip
        return cls(**extra)


@dataclass(frozen=True)
class _Load:
    """A consumer's read: the producer's blocks into these local ones."""

    req_id: str
    local_block_ids: list[int]
    remote_block_ids: list[int]
    remote_request_id: str
    host: str
    port: int


@dataclass
class P2PMetadata(KVConnectorMetadata):
    # Producer: finished requests whose blocks to serve, with their block ids.
    sends: list[tuple[str, list[int]]] = field(default_factory=list)
    # Consumer: reads to start.
    loads: list[_Load] = field(default_factory=list)


@dataclass
class _Lease:
    block_ids: list[int]
    expiry: float
    num_reading: int = 0  # reads under way: the lease never expires during one


class P2PConnector(KVConnector):
    def __init__(self, config: EngineConfig, role: KVConnectorRole) -> None:
        super().__init__(config, role)
        self.options = P2POptions.from_config(config)
        self.block_size = config.cache.block_size
        kv_role = config.kv_transfer.kv_role or "kv_both"
        self.produces = kv_role in ("kv_producer", "kv_both")
        self.consumes = kv_role in ("kv_consumer", "kv_both")
        # Tensor-parallel rank r of this engine serves its share of the blocks (its KV
        # heads) on port + r; data-parallel engines take consecutive ranges.
        parallel = config.parallel
        self.port = (
            self.options.kv_port + parallel.data_parallel_rank * parallel.tensor_parallel_size
        )
        self.engine_id = f"{self.options.kv_host}:{self.port}"
        self._step = P2PMetadata()
        # Worker role state (set in register_kv_caches).
        self._caches: list[torch.Tensor] = []
        self.facts: dict[str, Any] = {}  # what the handshake compares (p2p_wire.COMPAT_FIELDS)
        self._lock = threading.Condition()
        self._leases: dict[str, _Lease] = {}
        self._report = KVConnectorOutput()  # what get_finished hands over next (_lock)
        self._server: socketserver.ThreadingTCPServer | None = None
        self._peers: dict[tuple[str, int], _Peer] = {}
        self._loader: ThreadPoolExecutor | None = None
        self._stopped = threading.Event()

    # -- scheduler role --------------------------------------------------------------------

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int, bool]:
        """Every prompt token the producer computed but the last (whose logits give the
        first token): the last block is read whole, partly filled."""
        params = request.kv_transfer_params or {}
        if not (self.consumes and params.get("do_remote_prefill")):
            return 0, False
        covered = len(params.get("remote_block_ids") or []) * self.block_size
        count = min(covered, request.num_tokens - 1) - num_computed_tokens
        return (count, True) if count > 0 else (0, False)

    def update_state_after_alloc(
        self, request: Request, block_ids: tuple[list[int], ...], num_external_tokens: int
    ) -> None:
        if num_external_tokens == 0:
            return
        params = request.kv_transfer_params or {}
        start = request.num_computed_tokens // self.block_size
        end = request.num_computed_tokens + num_external_tokens
        stop = -(-end // self.block_size)  # the block holding the last external token
        self._step.loads.append(_Load(
            request.request_id, list(block_ids[0][start:stop]),
            list(params["remote_block_ids"][start:stop]), str(params["remote_request_id"]),
            str(params["remote_host"]), int(params["remote_port"]),
        ))  # fmt: skip

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        step, self._step = self._step, P2PMetadata()
        return step

    def request_finished(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        params = request.kv_transfer_params or {}
        finished_well = request.status in (
            RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH_CAPPED
        )  # fmt: skip
        if not (self.produces and params.get("do_remote_decode") and finished_well):
            return False, None
        ids = list(block_ids[0])
        self._step.sends.append((request.request_id, ids))
        return True, {
            "do_remote_decode": False,
            "do_remote_prefill": True,
            "remote_engine_id": self.engine_id,
            "remote_block_ids": ids,
            "remote_request_id": request.request_id,
            "remote_host": self.options.kv_host,
            "remote_port": self.port,
        }

    # -- worker role: both sides -----------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._caches = [kv_caches[name] for name in sorted(kv_caches)]
        first = self._caches[0]
        self.facts = {
            "core": __version__,
            "model": self.config.model.model,
            "dtype": str(first.dtype),
            "block_size": self.block_size,
            "tensor_parallel_size": self.config.parallel.tensor_parallel_size,
            "num_layers": len(self._caches),
            "page_shape": list(first.shape[1:]),
        }
        if self.produces:
            self._serve()
        if self.consumes:
            self._loader = ThreadPoolExecutor(max_workers=4, thread_name_prefix="core-p2p-load")
            threading.Thread(target=self._heartbeat_loop, daemon=True,
                             name="core-p2p-heartbeat").start()  # fmt: skip

    def start_load_kv(self, forward_context: Any) -> None:
        meta = self.connector_metadata
        assert isinstance(meta, P2PMetadata)
        now = time.monotonic()
        with self._lock:
            for req_id, ids in meta.sends:
                self._leases[req_id] = _Lease(ids, now + self.options.lease_s)
            self._lock.notify_all()
        for load in meta.loads:
            assert self._loader is not None  # loads are only planned by consumers
            peer = self._peer(load.host, load.port + self.rank)
            peer.pending.add(load.remote_request_id)
            self._loader.submit(self._load, peer, load)

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any) -> None:
        """Nothing to do per layer: a producer serves a request's blocks once it finished."""

    def shutdown(self) -> None:
        """Stop serving (the port is free again), drop queued reads, close connections."""
        self._stopped.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._loader is not None:
            self._loader.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            peers, self._peers = list(self._peers.values()), {}
        for peer in peers:
            peer.close()

    def get_finished(self, finished_req_ids: set[str]) -> KVConnectorOutput:
        with self._lock:
            self._expire_leases()
            output, self._report = self._report, KVConnectorOutput()
        return output

    def _gather(self, block_ids: list[int]) -> torch.Tensor:
        """The blocks as the wire carries them: [num_layers, num_blocks, *page], one gather
        per layer (not one copy per block and layer: the other thread of this process runs
        the model and waits for the GIL between those)."""
        ids = torch.tensor(block_ids)
        return torch.stack([cache.index_select(0, ids) for cache in self._caches])

    def _layout(self, num_blocks: int) -> tuple[torch.Size, int]:
        """The wire shape of `num_blocks` blocks and its size in bytes."""
        first = self._caches[0]
        shape = torch.Size((len(self._caches), num_blocks, *first.shape[1:]))
        return shape, shape.numel() * first.element_size()

    # -- worker role: producer -------------------------------------------------------------

    def _serve(self) -> None:
        connector = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                connector._handle(self.request)

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        port = self.port + self.rank
        self._server = socketserver.ThreadingTCPServer(("0.0.0.0", port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True,
                         name="core-p2p-server").start()  # fmt: skip
        logger.info("p2p: rank %d serves KV blocks on port %d", self.rank, port)

    def _handle(self, sock: socket.socket) -> None:
        """One consumer connection: the handshake, then READ / DONE / HEARTBEAT."""
        sock.settimeout(self.options.peer_ttl_s)  # an idle consumer is let go
        try:
            hello = wire.expect(wire.recv_message(sock), "HELLO")
            mismatch = wire.incompatibility(self.facts, hello.get("facts", {}))
            if mismatch is not None:
                wire.send_message(sock, {"type": "REFUSED", "reason": mismatch})
                return
            wire.send_message(sock, {"type": "OK", "engine_id": self.engine_id})
            while True:
                self._answer(sock, wire.recv_message(sock))
        except (OSError, wire.WireError, ValueError):
            pass  # the consumer went away: its leases expire on their own
        finally:
            sock.close()

    def _answer(self, sock: socket.socket, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "READ":
            self._send_blocks(sock, str(message["req_id"]), list(message["block_ids"]))
        elif kind == "DONE":
            with self._lock:
                if self._leases.pop(str(message["req_id"]), None) is not None:
                    self._report.finished_sending.add(str(message["req_id"]))
        elif kind == "HEARTBEAT":
            extended = time.monotonic() + self.options.lease_s * 2 / 3
            with self._lock:
                for req_id in message["req_ids"]:
                    lease = self._leases.get(str(req_id))
                    if lease is not None:
                        lease.expiry = max(lease.expiry, extended)
        else:
            raise wire.WireError(f"unknown message {kind!r}")

    def _send_blocks(self, sock: socket.socket, req_id: str, block_ids: list[int]) -> None:
        with self._lock:
            self._lock.wait_for(lambda: req_id in self._leases, timeout=_REGISTER_WAIT_S)
            lease = self._leases.get(req_id)
            if lease is None or not set(block_ids) <= set(lease.block_ids):
                reason = f"request {req_id}: no such blocks here (lease expired or unknown)"
                wire.send_message(sock, {"type": "ERROR", "reason": reason})
                return
            lease.num_reading += 1
        start = time.perf_counter()
        try:
            payload = _as_bytes(self._gather(block_ids))
            wire.send_message(sock, {"type": "DATA", "num_bytes": payload.nbytes})
            sock.sendall(payload)
        finally:
            with self._lock:
                lease.num_reading -= 1
        with self._lock:
            self._report.count_moved(len(block_ids), payload.nbytes, time.perf_counter() - start)

    def _expire_leases(self) -> None:
        """Free the blocks of leases past their expiry with no read under way (every
        lease is scanned: heartbeats move expiries, so the table is in no order)."""
        now = time.monotonic()
        for req_id, lease in list(self._leases.items()):
            if lease.expiry <= now and lease.num_reading == 0:
                logger.warning("p2p: request %s's blocks were not fetched within the lease; "
                               "freeing them", req_id)  # fmt: skip
                del self._leases[req_id]
                self._report.finished_sending.add(req_id)

    # -- worker role: consumer -------------------------------------------------------------

    def _peer(self, host: str, port: int) -> _Peer:
        with self._lock:
            peer = self._peers.get((host, port))
            if peer is None:
                peer = self._peers[(host, port)] = _Peer(host, port)
            return peer

    def _load(self, peer: _Peer, load: _Load) -> None:
        """Read one request's blocks into its local blocks; its id is then reported in
        finished_recving, and in failed_recving too when anything went wrong."""
        start = time.perf_counter()
        try:
            with peer.lock:
                peer.pending.discard(load.remote_request_id)
                blocks = self._read(peer, load)
                local = torch.tensor(load.local_block_ids)
                for cache, layer_blocks in zip(self._caches, blocks, strict=True):
                    cache.index_copy_(0, local, layer_blocks)
                wire.send_message(peer.sock, {"type": "DONE", "req_id": load.remote_request_id})
                peer.last_used = time.monotonic()
            failed = False
        except (OSError, wire.WireError, ValueError) as exc:
            logger.warning("p2p: reading %s's KV from %s:%d failed (%s); it recomputes its "
                           "prompt", load.req_id, load.host, load.port + self.rank,
                           exc)  # fmt: skip
            peer.close()
            failed = True
        with self._lock:
            self._report.finished_recving.add(load.req_id)
            if failed:
                self._report.failed_recving.add(load.req_id)
            else:
                seconds = time.perf_counter() - start
                self._report.count_moved(len(load.local_block_ids), blocks.nbytes, seconds)

    def _read(self, peer: _Peer, load: _Load) -> torch.Tensor:
        """The producer's blocks of `load`, received straight into one tensor."""
        sock = peer.connect(self.facts, self.options.timeout_s)
        wire.send_message(sock, {"type": "READ", "req_id": load.remote_request_id,
                                 "block_ids": load.remote_block_ids})  # fmt: skip
        reply = wire.expect(wire.recv_message(sock), "DATA")
        shape, expected = self._layout(len(load.local_block_ids))
        if int(reply["num_bytes"]) != expected:
            raise wire.WireError(f"{reply['num_bytes']} bytes of blocks, expected {expected}")
        blocks = torch.empty(shape, dtype=self._caches[0].dtype)
        wire.recv_into(sock, _as_bytes(blocks))
        return blocks

    def _heartbeat_loop(self) -> None:
        """Extend the leases of reads still waiting their turn, and close connections idle
        past peer_ttl_s (never one with a read waiting or under way)."""
        while not self._stopped.wait(max(self.options.lease_s / 3, 0.05)):
            with self._lock:
                peers = list(self._peers.items())
            for key, peer in peers:
                if not peer.lock.acquire(timeout=0):
                    continue  # a read is under way: it keeps the lease and the connection
                try:
                    if peer.pending:
                        peer.beat()
                    elif peer.idle_for() > self.options.peer_ttl_s:
                        peer.close()
                        with self._lock:
                            self._peers.pop(key, None)
                finally:
                    peer.lock.release()


class _Peer:
    """A consumer's connection to one producer, used by one read at a time (`lock`)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.sock: socket.socket | None = None
        self.lock = threading.Lock()
        self.pending: set[str] = set()  # remote request ids whose reads wait their turn
        self.last_used = time.monotonic()

    def connect(self, facts: dict[str, Any], timeout_s: float) -> socket.socket:
        """The open connection, or a new one after the handshake (WireError if refused)."""
        if self.sock is not None:
            return self.sock
        sock = socket.create_connection((self.host, self.port), timeout=timeout_s)
        try:
            wire.send_message(sock, {"type": "HELLO", "facts": facts})
            reply = wire.recv_message(sock)
            if reply["type"] == "REFUSED":
                raise wire.WireError(f"the producer refused the handshake: {reply['reason']}")
            wire.expect(reply, "OK")
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        return sock

    def beat(self) -> None:
        """A heartbeat for the reads waiting their turn (call holding `lock`)."""
        if self.sock is None:
            return
        try:
            wire.send_message(self.sock, {"type": "HEARTBEAT", "req_ids": sorted(self.pending)})
        except OSError:
            self.close()

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def idle_for(self) -> float:
        return time.monotonic() - self.last_used


def _as_bytes(tensor: torch.Tensor) -> memoryview:
    """A contiguous tensor's bytes, without a copy (what sockets send and receive into)."""
    return memoryview(tensor.view(torch.uint8).reshape(-1).numpy())
