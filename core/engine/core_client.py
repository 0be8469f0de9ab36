"""The frontend's handle on an engine-core process (spawned, ZMQ over IPC sockets)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from core.config import EngineConfig
from core.engine import core_proc
from core.engine.protocol import EngineCoreOutputs, EngineCoreRequest


class EngineDeadError(RuntimeError):
    """The engine-core process is gone; requests cannot be served."""


class EngineCoreClient:
    """Starts the engine-core process and talks to it; `start()` waits until it is ready."""

    def __init__(self, config: EngineConfig, model: str) -> None:
        self._ipc_dir = tempfile.mkdtemp(prefix="core-ipc-")
        input_addr = f"ipc://{self._ipc_dir}/input"
        output_addr = f"ipc://{self._ipc_dir}/output"
        self.ctx = zmq.asyncio.Context()
        self.input = self.ctx.socket(zmq.PUSH)
        self.input.bind(input_addr)
        self.output = self.ctx.socket(zmq.PULL)
        self.output.bind(output_addr)
        self.encoder = msgspec.msgpack.Encoder()
        self.outputs_decoder = msgspec.msgpack.Decoder(EngineCoreOutputs)
        self._command = [sys.executable, "-m", core_proc.__name__, model, input_addr, output_addr]
        self._config_json = config.model_dump_json()
        self.proc: subprocess.Popen | None = None
        self.dead_reason: str | None = None

    async def start(self, timeout_s: float = 600.0) -> dict[str, Any]:
        """Start the process and wait for READY; raise EngineDeadError if it fails.

        A fresh interpreter (not fork: the parent has torch threads and an event loop;
        not multiprocessing's spawn: it would re-run the user's __main__).
        """
        self.proc = subprocess.Popen(self._command, stdin=subprocess.PIPE)
        self.proc.stdin.write(self._config_json.encode())
        self.proc.stdin.close()
        deadline = asyncio.get_running_loop().time() + timeout_s
        while asyncio.get_running_loop().time() < deadline:
            if await self.output.poll(200):
                kind, payload = await self.output.recv_multipart()
                if kind == core_proc.READY:
                    return msgspec.msgpack.decode(payload)
                raise EngineDeadError(f"engine core failed to start: {payload.decode()}")
            if self.proc.poll() is not None:
                raise EngineDeadError(f"engine core exited with code {self.proc.returncode}")
        raise EngineDeadError(f"engine core not ready after {timeout_s:.0f} s")

    def watch(self, on_death: Callable[[str], None]) -> None:
        """Call `on_death(reason)` as soon as the process exits (no polling)."""
        loop = asyncio.get_running_loop()
        pidfd = os.pidfd_open(self.proc.pid)  # readable once the process has exited

        def exited() -> None:
            loop.remove_reader(pidfd)
            os.close(pidfd)
            self.dead_reason = f"engine core process exited (code {self.proc.wait()})"
            on_death(self.dead_reason)

        loop.add_reader(pidfd, exited)

    async def add_request(self, request: EngineCoreRequest) -> None:
        self._check_alive()
        await self.input.send_multipart([core_proc.ADD, self.encoder.encode(request)])

    async def abort_requests(self, request_ids: list[str]) -> None:
        if request_ids and self.dead_reason is None:
            await self.input.send_multipart([core_proc.ABORT, self.encoder.encode(request_ids)])

    async def utility(self, name: str) -> None:
        self._check_alive()
        await self.input.send_multipart([core_proc.UTILITY, self.encoder.encode(name)])

    async def get_outputs(self) -> EngineCoreOutputs:
        """The next outputs; EngineDeadError when the engine core reports its failure."""
        kind, payload = await self.output.recv_multipart()
        if kind == core_proc.OUTPUTS:
            return self.outputs_decoder.decode(payload)
        self.dead_reason = msgspec.msgpack.decode(payload) if kind == core_proc.FAILED else "?"
        raise EngineDeadError(f"engine core failed: {self.dead_reason}")

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
        self.ctx.destroy(linger=0)
        shutil.rmtree(self._ipc_dir, ignore_errors=True)
