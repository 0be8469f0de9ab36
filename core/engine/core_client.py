"""EngineCoreClient: the frontend's one handle on an engine core, in this process or its own.

Both frontends talk to the engine core only through this interface: LLMEngine holds an
InprocClient (the EngineCore in this process), AsyncLLM an MPClient (the EngineCore in a
process of its own, over ZMQ). The interface is async-shaped because the process client
waits on sockets. The in-process client's coroutines never suspend — each call does its
work, `get_outputs` one EngineCore step, and returns — so a synchronous frontend drives
them with `run_inline`, without an event loop (it works inside a running one too, e.g. a
notebook's). A sync-shaped interface would instead need a thread to wait on the sockets.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec
import zmq
import zmq.asyncio

from core.engine import core_proc
from core.engine.core import EngineCore, check_call, check_utility
from core.engine.protocol import EngineCoreOutputs, EngineCoreRequest

if TYPE_CHECKING:
    from core.config import EngineConfig
    from core.engine.processor import EngineSetup

__all__ = ["EngineCoreClient", "EngineDeadError", "InprocClient", "MPClient", "run_inline"]

T = TypeVar("T")


class EngineDeadError(RuntimeError):
    """The engine core is gone; requests cannot be served."""


class EngineCoreClient(ABC):
    """The frontend-engine contract, as calls.

    Lifecycle: `start()` once, then any of the calls below, then `shutdown()` once.
    Requests arrive validated (the InputProcessor's job) and with n > 1 already fanned out
    into child requests (the OutputProcessor's). `dead_reason` is None while the engine
    core can serve; once it is set, `add_request` and `utility` raise EngineDeadError,
    `get_outputs` raises it, and `abort_requests` does nothing.
    """

    def __init__(self) -> None:
        self.dead_reason: str | None = None

    @property
    def is_alive(self) -> bool:
        return self.dead_reason is None

    @abstractmethod
    async def start(self) -> dict[str, Any]:
        """Build or spawn the engine core; return once it takes requests, with its "pid"
        and "num_blocks" (KV-cache blocks). EngineDeadError when it cannot start."""

    @abstractmethod
    async def add_request(self, request: EngineCoreRequest) -> None:
        """Queue one request; its outputs come back through `get_outputs`."""

    @abstractmethod
    async def abort_requests(self, request_ids: list[str]) -> None:
        """Stop these requests and free their state; unknown or finished ids are ignored."""

    @abstractmethod
    async def utility(self, name: str) -> None:
        """Run the engine core's maintenance call `name` (one of `core.engine.core.UTILITIES`,
        e.g. "reset_prefix_cache"), fire and forget; ValueError for any other name, raised
        before anything reaches the engine core."""

    @abstractmethod
    async def call(self, name: str, *args: Any) -> Any:
        """Run the engine core's call `name` (one of `core.engine.core.CALLS`, e.g. "sleep")
        with `args` and return its answer once it ran. ValueError for any other name
        (raised before anything reaches the engine core) and for arguments the engine core
        refuses (it serves on). A process's answer comes back among its outputs: it is
        taken while `get_outputs` is awaited (AsyncLLM's output loop always awaits it)."""

    @abstractmethod
    async def get_outputs(self) -> EngineCoreOutputs:
        """The next outputs: in this process, one step's (empty when there is no work); from
        a process, the next it sends (waiting for them). EngineDeadError once it is dead."""

    @abstractmethod
    def shutdown(self) -> None:
        """Stop the engine core and free what the client holds."""

    def heartbeat_age(self) -> float | None:
        """Seconds since the engine core was last heard from (an output or a heartbeat;
        the oldest among several engines), or None where it runs in this process."""
        return None


class InprocClient(EngineCoreClient):
    """The EngineCore in this process; `get_outputs` runs one step.

    Its coroutines never suspend, so LLMEngine calls them through `run_inline`. An asyncio
    frontend should not use it: an idle `get_outputs` returns at once, so an output loop
    over it would never yield to the event loop.
    """

    def __init__(self, setup: EngineSetup) -> None:
        super().__init__()
        self._setup = setup
        self._core: EngineCore | None = None

    @property
    def core(self) -> EngineCore:
        """The engine core itself (introspection: its scheduler, KV cache, executor)."""
        if self._core is None:
            raise EngineDeadError("the in-process engine core is not running")
        return self._core

    async def start(self) -> dict[str, Any]:
        setup = self._setup
        self._core = EngineCore(setup.config, setup.platform, setup.checkpoint, setup.hooks)
        return {"pid": os.getpid(), "num_blocks": self._core.num_gpu_blocks}

    async def add_request(self, request: EngineCoreRequest) -> None:
        self.core.add_request(request)

    async def abort_requests(self, request_ids: list[str]) -> None:
        self.core.abort_requests(request_ids)

    async def utility(self, name: str) -> None:
        self.core.call_utility(name)

    async def call(self, name: str, *args: Any) -> Any:
        return self.core.call(name, *args)

    async def get_outputs(self) -> EngineCoreOutputs:
        return self.core.step()

    def shutdown(self) -> None:
        if self._core is not None:
            self._core.shutdown()
            self._core = None


def run_inline(call: Coroutine[Any, Any, T]) -> T:
    """The result of a coroutine that never suspends (an InprocClient call), run to its end
    without an event loop. RuntimeError when it does suspend: it needed a loop after all."""
    try:
        call.send(None)
    except StopIteration as done:
        return done.value
    call.close()
    raise RuntimeError("run_inline needs a client that never waits (the in-process client)")


class SocketClient(EngineCoreClient):
    """An engine core in another process, over two ZMQ sockets this client binds: requests
    out on `input_addr`, outputs back on `output_addr` (the engine core connects to both).
    Subclasses start it and say how its death shows."""

    def __init__(self, input_addr: str, output_addr: str) -> None:
        super().__init__()
        self.ctx = zmq.asyncio.Context()
        self.input = self.ctx.socket(zmq.PUSH)
        # No high-water mark: a burst of adds and aborts (thousands, when a client that sent
        # thousands of inputs leaves) made sends wait for room, and a waiting send was seen
        # never to wake, hanging every later request. What queues here is bounded by the
        # requests in flight, which the server bounds.
        self.input.setsockopt(zmq.SNDHWM, 0)
        self.input.bind(input_addr)
        self.output = self.ctx.socket(zmq.PULL)
        self.output.bind(output_addr)
        self.encoder = msgspec.msgpack.Encoder()
        self.outputs_decoder = msgspec.msgpack.Decoder(EngineCoreOutputs)
        self._last_heard = time.monotonic()
        self._call_ids = itertools.count()
        self._answers: dict[int, asyncio.Future] = {}  # call id -> its caller's answer

    def heartbeat_age(self) -> float:
        return time.monotonic() - self._last_heard

    async def _receive(self) -> tuple[bytes, bytes]:
        """The next message from the engine core (heartbeats too), noting when it came; a
        call's REPLY goes to its caller and reads as a heartbeat."""
        kind, payload = await self.output.recv_multipart()
        self._last_heard = time.monotonic()
        if kind == core_proc.REPLY:
            self._take_reply(payload)
            return core_proc.HEARTBEAT, b""
        return kind, payload

    def _take_reply(self, payload: bytes) -> None:
        """Hand a REPLY to the call waiting for it (none: its caller left)."""
        call_id, value, refusal = msgspec.msgpack.decode(payload)
        answer = self._answers.get(call_id)
        if answer is None or answer.done():
            return
        if refusal is None:
            answer.set_result(value)
        else:
            answer.set_exception(ValueError(refusal))

    @abstractmethod
    def _check_alive(self) -> None:
        """EngineDeadError when the engine core cannot take requests."""

    async def add_request(self, request: EngineCoreRequest) -> None:
        self._check_alive()
        await self.input.send_multipart([core_proc.ADD, self.encoder.encode(request)])

    async def abort_requests(self, request_ids: list[str]) -> None:
        if request_ids and self.dead_reason is None:
            await self.input.send_multipart([core_proc.ABORT, self.encoder.encode(request_ids)])

    async def utility(self, name: str) -> None:
        check_utility(name)
        self._check_alive()
        await self.input.send_multipart([core_proc.UTILITY, self.encoder.encode(name)])

    async def call(self, name: str, *args: Any) -> Any:
        check_call(name)
        self._check_alive()
        call_id = next(self._call_ids)
        answer = self._answers[call_id] = asyncio.get_running_loop().create_future()
        try:
            message = self.encoder.encode([call_id, name, list(args)])
            await self.input.send_multipart([core_proc.CALL, message])
            return await answer
        finally:
            self._answers.pop(call_id, None)

    async def start_wave(self, wave: int) -> None:
        """Lock-step engines: join wave `wave` (another engine started it)."""
        if self.dead_reason is None:
            await self.input.send_multipart([core_proc.START_WAVE, self.encoder.encode(wave)])

    def _decode(self, kind: bytes, payload: bytes) -> EngineCoreOutputs:
        if kind == core_proc.OUTPUTS:
            return self.outputs_decoder.decode(payload)
        reason = msgspec.msgpack.decode(payload) if kind == core_proc.FAILED else "?"
        raise self._died(f"engine core failed: {reason}")

    def _died(self, reason: str) -> EngineDeadError:
        self.dead_reason = self.dead_reason or reason
        for answer in self._answers.values():  # no reply will come
            if not answer.done():
                answer.set_exception(EngineDeadError(reason))
        return EngineDeadError(reason)


class MPClient(SocketClient):
    """The EngineCore in a process of its own (spawned, ZMQ over IPC sockets).

    `get_outputs` waits on the output socket and on the process itself (a pidfd, readable
    once it exits), so a killed engine core fails the waiting requests at once, without
    polling. Its coroutines need a running event loop (AsyncLLM's).
    """

    def __init__(self, setup: EngineSetup, data_parallel_rank: int = 0) -> None:
        ipc_dir = tempfile.mkdtemp(prefix="core-ipc-")
        # Removed by shutdown, else when this client is collected or the interpreter exits.
        self._remove_ipc_dir = weakref.finalize(self, shutil.rmtree, ipc_dir, True)
        input_addr = f"ipc://{ipc_dir}/input"
        output_addr = f"ipc://{ipc_dir}/output"
        super().__init__(input_addr, output_addr)
        model = str(setup.checkpoint.path)
        self._command = [sys.executable, "-m", core_proc.__name__, model, input_addr, output_addr]
        self._config_json = with_data_parallel_rank(setup.config, data_parallel_rank)
        self.proc: subprocess.Popen | None = None
        self._pidfd: int | None = None
        self._poller = zmq.asyncio.Poller()
        self._poller.register(self.output, zmq.POLLIN)

    async def start(self, timeout_s: float = 600.0) -> dict[str, Any]:
        """Start the process and wait for READY.

        A fresh interpreter (not fork: the parent has torch threads and an event loop;
        not multiprocessing's spawn: it would re-run the user's __main__).
        """
        self.proc = subprocess.Popen(self._command, stdin=subprocess.PIPE)
        self.proc.stdin.write(self._config_json.encode())
        self.proc.stdin.close()
        self._pidfd = os.pidfd_open(self.proc.pid)
        self._poller.register(self._pidfd, zmq.POLLIN)
        deadline = asyncio.get_running_loop().time() + timeout_s
        while asyncio.get_running_loop().time() < deadline:
            if await self.output.poll(200):
                kind, payload = await self._receive()
                if kind == core_proc.READY:
                    return msgspec.msgpack.decode(payload)
                reason = msgspec.msgpack.decode(payload) if kind == core_proc.FAILED else kind
                raise self._died(f"engine core failed to start: {reason}")
            if self.proc.poll() is not None:
                raise self._died(f"engine core exited with code {self.proc.returncode}")
        raise self._died(f"engine core not ready after {timeout_s:.0f} s")

    async def get_outputs(self) -> EngineCoreOutputs:
        """Outputs sent before a death are still delivered; then EngineDeadError."""
        if self._pidfd is None:
            raise EngineDeadError("engine core process not started")
        while True:
            ready = dict(await self._poller.poll())
            if self.output not in ready:  # only the pidfd: the process has exited
                raise self._died(f"engine core process exited (code {self.proc.wait()})")
            kind, payload = await self._receive()
            if kind != core_proc.HEARTBEAT:
                return self._decode(kind, payload)

    def _check_alive(self) -> None:
        if self.dead_reason is not None or self.proc is None or self.proc.poll() is not None:
            raise EngineDeadError(self.dead_reason or "engine core process is not running")

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Stop the process (SIGTERM lets it run its shutdown hooks, then SIGKILL)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        self.ctx.destroy(linger=0)
        self._remove_ipc_dir()


class RemoteClient(SocketClient):
    """A data-parallel engine core on another node, started there by `core serve --headless`
    and reached over TCP: this client binds `--data-parallel-rpc-port + 2 * rank` (its
    requests) and the next port (its outputs) and waits for it to connect. With no process
    to watch, its heartbeats say it is alive: `HEARTBEAT_TIMEOUT_S` without any message
    makes it dead, so a lost node fails its requests instead of hanging them.
    """

    HEARTBEAT_TIMEOUT_S = 10 * core_proc.HEARTBEAT_S

    def __init__(self, data_parallel_rank: int, rpc_port: int) -> None:
        port = rpc_port + 2 * data_parallel_rank
        super().__init__(f"tcp://*:{port}", f"tcp://*:{port + 1}")
        self.rank = data_parallel_rank

    async def start(self, timeout_s: float = 600.0) -> dict[str, Any]:
        if not await self.output.poll(timeout_s * 1000):
            raise self._died(
                f"data-parallel engine {self.rank} did not connect within {timeout_s:.0f} s "
                "(start it with core serve --headless on its node)"
            )
        kind, payload = await self._receive()
        if kind != core_proc.READY:
            reason = msgspec.msgpack.decode(payload) if kind == core_proc.FAILED else kind
            raise self._died(f"data-parallel engine {self.rank} failed to start: {reason}")
        return msgspec.msgpack.decode(payload)

    async def get_outputs(self) -> EngineCoreOutputs:
        while True:
            if not await self.output.poll(self.HEARTBEAT_TIMEOUT_S * 1000):
                raise self._died(
                    f"data-parallel engine {self.rank} sent nothing for "
                    f"{self.HEARTBEAT_TIMEOUT_S:.0f} s"
                )
            kind, payload = await self._receive()
            if kind != core_proc.HEARTBEAT:
                return self._decode(kind, payload)

    def _check_alive(self) -> None:
        if self.dead_reason is not None:
            raise EngineDeadError(self.dead_reason)

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Tell the remote engine core to stop (its node's `core serve --headless` ends
        with its engine cores), then close the sockets."""
        if self.dead_reason is None:
            self.input.send_multipart([core_proc.STOP, b""])
        self.ctx.destroy(linger=int(timeout_s * 1000))


def with_data_parallel_rank(config: EngineConfig, rank: int) -> str:
    """`config` as JSON for the engine core of data-parallel rank `rank`."""
    data = json.loads(config.model_dump_json())
    data["parallel"]["data_parallel_rank"] = rank
    return json.dumps(data)
