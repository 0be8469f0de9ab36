"""UniProcExecutor: one worker, in the engine-core process.

It joins no process group, unless experts span data-parallel engines: then its rank is
this engine core's part of their shared world (worker_proc.join_world).

Under async scheduling the worker runs on a thread of its own, so the engine core can
schedule the next step while one runs: torch's kernels release the GIL, leaving the
scheduler the interpreter while the model computes. Every call reaches the worker through
that thread once it exists, in the order made, so none overtakes a step in flight.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from core.config import EngineConfig
from core.executor.interface import Executor
from core.executor.worker_proc import join_world
from core.model_loader import Checkpoint
from core.platforms.interface import Platform
from core.worker.contract import ModelRunnerOutput, SchedulerOutput
from core.worker.worker import Worker


class UniProcExecutor(Executor):
    def __init__(
        self, config: EngineConfig, platform: Platform, checkpoint: Checkpoint | None = None
    ) -> None:
        super().__init__(config)
        if config.parallel.experts_span_engines:  # the address comes from the config
            join_world(config, platform, 0, "", local_rank=0)
        self.worker = Worker(config, platform)
        self.worker.init_device()
        self.worker.load_model(checkpoint)
        self._thread: ThreadPoolExecutor | None = None

    def collective_rpc(
        self,
        method: str,
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
        reply_ranks: tuple[int, ...] | None = None,
    ) -> list[Any]:
        call = getattr(self.worker, method)
        if self._thread is None:
            return [call(*args, **(kwargs or {}))]  # rank 0 is all
        return [self._thread.submit(call, *args, **(kwargs or {})).result()]

    def execute_model_async(
        self, scheduler_output: SchedulerOutput
    ) -> Callable[[], ModelRunnerOutput]:
        """Start the step on the worker's thread (made at the first call); the returned
        function waits for its output."""
        if self._thread is None:
            # A new thread starts with OpenMP's default team size: keep the engine's.
            threads = torch.get_num_threads()
            self._thread = ThreadPoolExecutor(
                1, "core-worker", initializer=torch.set_num_threads, initargs=(threads,)
            )
        return self._thread.submit(self.worker.execute_model, scheduler_output).result

    def shutdown(self) -> None:
        if self._thread is not None:
            self._thread.shutdown(wait=True)
            self._thread = None
        self.worker.shutdown()
