"""UniProcExecutor: one worker, in the engine-core process.

It joins no process group, unless experts span data-parallel engines: then its rank is
this engine core's part of their shared world (worker_proc.join_world).

Under async scheduling the worker lives on a thread of its own, so the engine core can
schedule the next step while one runs: torch's kernels release the GIL, leaving the
scheduler the interpreter while the model computes. Every call reaches the worker through
that thread, in the order made, so none overtakes a step in flight.
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
        # Async scheduling: every call runs on the worker's thread, its loading included.
        # Torch's parallel regions then all start from that one thread: a second thread
        # starting them keeps a second OpenMP team, whose waiting threads took half the
        # cores from the other (a decode step 2x slower on a 2-core EPYC).
        self._thread = (
            ThreadPoolExecutor(
                1,
                "core-worker",
                initializer=torch.set_num_threads,
                initargs=(torch.get_num_threads(),),
            )  # fmt: skip
            if config.scheduler.async_scheduling
            else None
        )
        self.worker = self._call(Worker, config, platform)
        self._call(self.worker.init_device)
        self._call(self.worker.load_model, checkpoint)

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """fn(*args, **kwargs) on the worker's thread where it has one, else here."""
        if self._thread is None:
            return fn(*args, **kwargs)
        return self._thread.submit(fn, *args, **kwargs).result()

    def collective_rpc(
        self,
        method: str,
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
        reply_ranks: tuple[int, ...] | None = None,
    ) -> list[Any]:
        return [self._call(getattr(self.worker, method), *args, **(kwargs or {}))]  # rank 0

    def execute_model_async(
        self, scheduler_output: SchedulerOutput
    ) -> Callable[[], ModelRunnerOutput]:
        """Start the step on the worker's thread; the returned function waits for its
        output. Without async scheduling (no thread) the step runs now."""
        if self._thread is None:
            return super().execute_model_async(scheduler_output)
        return self._thread.submit(self.worker.execute_model, scheduler_output).result

    def shutdown(self) -> None:
        if self._thread is not None:
            self._thread.shutdown(wait=True)
            self._thread = None
        self.worker.shutdown()
