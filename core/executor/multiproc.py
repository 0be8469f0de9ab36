"""MultiprocExecutor: a worker process per rank on this host (executor backend `mp`).

Each call is broadcast to every worker through one shared-memory ring buffer
(core.distributed.shm_broadcast: one write per step, whatever the number of ranks) and
answered over a ZMQ socket: by the output rank alone for `execute_model` (every rank samples
the same tokens; every rank with a KV connector, each reporting its own transfers), by every
rank for the calls whose answers differ. A monitor thread watches
the workers; when one dies the others are stopped (they would wait forever in a
collective) and the pending and every later call raise WorkerDiedError, which fails the
engine's requests instead of hanging it.
"""

from __future__ import annotations

import logging
import os
import pickle
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import zmq

from core.config import EngineConfig
from core.distributed.shm_broadcast import MessageQueue
from core.executor import worker_proc
from core.executor.interface import Executor
from core.model_loader import Checkpoint, resolve_model
from core.platforms.interface import Platform
from core.worker.contract import ModelRunnerOutput, SchedulerOutput

logger = logging.getLogger(__name__)

_POLL_MS = 100  # how often a waiting call checks that the workers are alive
_STARTUP_TIMEOUT_S = 600.0
_DEATH_GRACE_S = 1.0  # how long a failed call waits to learn whether a worker died


class WorkerDiedError(RuntimeError):
    """A worker process exited while the engine needed it."""


class MultiprocExecutor(Executor):
    def __init__(
        self, config: EngineConfig, platform: Platform, checkpoint: Checkpoint | None = None
    ) -> None:
        super().__init__(config)
        parallel = config.parallel
        self.world_size = parallel.world_size
        # A data-parallel engine core's workers take the devices after those of the engine
        # cores before it on this node.
        local_index = parallel.data_parallel_rank - parallel.data_parallel_start_rank
        first_device = local_index * self.world_size
        checkpoint = checkpoint or resolve_model(config.model.model)
        ipc_dir = tempfile.mkdtemp(prefix="core-workers-")
        # Removed by shutdown, else when this executor is collected or the interpreter
        # exits (an offline LLM is seldom shut down; its workers die with this process).
        self._remove_ipc_dir = weakref.finalize(self, shutil.rmtree, ipc_dir, True)
        self._ctx = zmq.Context()
        self._replies = self._ctx.socket(zmq.PULL)
        reply_address = f"ipc://{ipc_dir}/replies"
        self._replies.bind(reply_address)
        self._calls = MessageQueue(self.world_size)
        self._dead: str | None = None
        self._started = self._waited = 0  # execute_model calls sent / answered
        self._stopping = False
        init_method = f"tcp://127.0.0.1:{_free_port()}"
        threads = max(1, (os.cpu_count() or 1) // self.world_size)
        self.workers = [
            self._spawn(
                worker_proc.WorkerSetup(
                    config_json=config.model_dump_json(),
                    model=str(checkpoint.path),
                    rank=rank,
                    distributed_init_method=init_method,
                    rpc_handle=self._calls.handle(),
                    reply_address=reply_address,
                    num_threads=threads,
                    local_rank=first_device + rank,
                ),
                threads,
            )
            for rank in range(self.world_size)
        ]
        self._monitor = threading.Thread(target=self._watch, name="worker-monitor", daemon=True)
        self._monitor.start()
        try:
            self._collect(range(self.world_size), _STARTUP_TIMEOUT_S)
        except BaseException:
            self.shutdown()
            raise

    def _spawn(self, setup: worker_proc.WorkerSetup, threads: int) -> subprocess.Popen:
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        command = [sys.executable, "-m", worker_proc.__name__]
        process = subprocess.Popen(command, stdin=subprocess.PIPE, env=env)
        process.stdin.write(pickle.dumps(setup))
        process.stdin.close()
        return process

    def collective_rpc(
        self,
        method: str,
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
        reply_ranks: tuple[int, ...] | None = None,
    ) -> list[Any]:
        """WorkerDiedError when a worker is gone; RuntimeError carrying a worker's
        traceback when the call raised there."""
        self._check_alive()
        if self._started != self._waited:
            raise RuntimeError(f"{method}: a step is still in flight; wait for it first")
        self._calls.enqueue((method, args, kwargs or {}, reply_ranks))
        ranks = range(self.world_size) if reply_ranks is None else reply_ranks
        return self._collect(ranks, timeout_s=None)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """The output of the last pipeline stage's first tensor-parallel rank (it sampled)."""
        return self.execute_model_async(scheduler_output)()

    def execute_model_async(
        self, scheduler_output: SchedulerOutput
    ) -> Callable[[], ModelRunnerOutput]:
        self._check_alive()
        ranks = self.step_reply_ranks()
        self._calls.enqueue(("execute_model", (scheduler_output,), {}, ranks))
        self._started += 1
        step = self._started

        def wait() -> ModelRunnerOutput:
            # Each step's replies (the output rank's alone unless a KV connector needs every
            # rank's: then no two steps are in flight) come in the order the steps started.
            if step != self._waited + 1:
                raise RuntimeError("steps' outputs must be waited for in the order they started")
            self._waited = step
            return self.step_output(self._collect(ranks, timeout_s=None))

        return wait

    def _collect(self, ranks, timeout_s: float | None) -> list[Any]:
        wanted = set(ranks)
        answers: dict[int, Any] = {}
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while len(answers) < len(wanted):
            if self._replies.poll(_POLL_MS):
                reply: worker_proc.Reply = pickle.loads(self._replies.recv())
                if reply.error is not None:
                    # A rank whose peer died fails in its collective first: name the death.
                    self._wait_for_death(_DEATH_GRACE_S)
                    self._check_alive()
                    raise RuntimeError(f"worker rank {reply.rank} failed:\n{reply.error}")
                answers[reply.rank] = reply.value
                continue
            self._check_alive()
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"workers not ready after {timeout_s:.0f} s")
        return [answers[rank] for rank in sorted(wanted)]

    def _watch(self) -> None:
        while not self._stopping:
            for rank, process in enumerate(self.workers):
                code = process.poll()
                if code is not None and not self._stopping:
                    self._dead = f"worker rank {rank} (pid {process.pid}) exited with code {code}"
                    logger.error("%s; stopping the other workers", self._dead)
                    self._terminate()
                    if self.on_failure is not None:
                        self.on_failure(self._dead)
                    return
            time.sleep(_POLL_MS / 1000)

    def _wait_for_death(self, seconds: float) -> None:
        """Give the monitor `seconds` to notice a worker that is exiting."""
        deadline = time.monotonic() + seconds
        while self._dead is None and time.monotonic() < deadline:
            if any(process.poll() is not None for process in self.workers):
                self._monitor.join(timeout=max(deadline - time.monotonic(), 0))
                return
            time.sleep(0.01)

    def _check_alive(self) -> None:
        if self._dead is not None:
            raise WorkerDiedError(self._dead)

    def shutdown(self) -> None:
        """Ask the workers to stop, then make sure they did; remove the IPC files."""
        if self._stopping:
            return
        self._stopping = True
        if self._dead is None:
            try:
                self._calls.enqueue((worker_proc.SHUTDOWN, (), {}, ()), timeout=5.0)
            except TimeoutError:
                pass
        self._terminate(grace_s=5.0)
        self._calls.close()
        self._ctx.destroy(linger=0)
        self._remove_ipc_dir()

    def _terminate(self, grace_s: float = 0.0) -> None:
        deadline = time.monotonic() + grace_s
        for process in self.workers:
            try:
                process.wait(max(deadline - time.monotonic(), 0))
            except subprocess.TimeoutExpired:
                process.terminate()
        for process in self.workers:
            try:
                process.wait(5.0)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
