"""UniProcExecutor: one worker, in the engine-core process.

It joins no process group, unless experts span data-parallel engines: then its rank is
this engine core's part of their shared world (worker_proc.join_world)."""

from __future__ import annotations

from typing import Any

from core.config import EngineConfig
from core.executor.interface import Executor
from core.executor.worker_proc import join_world
from core.model_loader import Checkpoint
from core.platforms.interface import Platform
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

    def collective_rpc(
        self,
        method: str,
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
        reply_ranks: tuple[int, ...] | None = None,
    ) -> list[Any]:
        return [getattr(self.worker, method)(*args, **(kwargs or {}))]  # rank 0 is all

    def shutdown(self) -> None:
        self.worker.shutdown()
