"""DPClient: data parallelism, N engine cores behind one frontend (`--data-parallel-size`).

Each engine core is an MPClient of its own process with its own workers (its own TP/PP
groups); they share nothing but the frontend. Engine cores of other nodes (`core serve
--headless` there) are RemoteClients over TCP. A new request goes to the engine with the
fewest unfinished requests, ties broken by the lower KV-cache usage of its last stats, and
stays there (aborts follow it). Outputs come from whichever engine answers first, each batch
with its engine's own stats and index (metrics label every engine's series apart).

The engines run independently, except when experts span them
(ParallelConfig.experts_span_engines): then they step in lock-step waves
(core.engine.core_proc), and this client coordinates the waves: when an engine says it
starts one (`EngineCoreOutputs.start_wave`), every other engine is told to join it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from core.engine.core_client import (
    EngineCoreClient,
    EngineDeadError,
    MPClient,
    RemoteClient,
    SocketClient,
    check_call,
    check_utility,
)
from core.engine.protocol import EngineCoreOutputs, EngineCoreRequest, SchedulerStats

if TYPE_CHECKING:
    from core.engine.processor import EngineSetup

__all__ = ["DPClient"]


class DPClient(EngineCoreClient):
    def __init__(self, setup: EngineSetup, size: int) -> None:
        super().__init__()
        parallel = setup.config.parallel
        local = parallel.local_data_parallel_ranks
        if local.start != 0:
            raise ValueError(
                "--data-parallel-start-rank: the node with the API server starts at rank 0; "
                "run the others with core serve --headless"
            )
        self.engines: list[SocketClient] = [
            MPClient(setup, data_parallel_rank=rank)
            if rank in local
            else RemoteClient(rank, parallel.data_parallel_rpc_port)
            for rank in range(size)
        ]
        self._owner: dict[str, int] = {}  # request id -> engine index
        self._load = [0] * size  # unfinished requests per engine
        self._stats: list[SchedulerStats | None] = [None] * size
        self._waiting: dict[int, asyncio.Task] = {}  # engine index -> its get_outputs

    async def start(self) -> dict[str, Any]:
        infos = await asyncio.gather(*(engine.start() for engine in self.engines))
        return {
            "pid": [info["pid"] for info in infos],
            "num_blocks": min(info["num_blocks"] for info in infos),
        }

    def choose(self) -> int:
        """The engine a new request goes to: fewest unfinished, then least KV in use."""

        def load(index: int) -> tuple[int, float]:
            stats = self._stats[index]
            return self._load[index], stats.kv_cache_usage if stats else 0.0

        return min(range(len(self.engines)), key=load)

    async def add_request(self, request: EngineCoreRequest) -> None:
        self._check_alive()
        index = self.choose()
        self._owner[request.request_id] = index
        self._load[index] += 1
        await self.engines[index].add_request(request)

    async def abort_requests(self, request_ids: list[str]) -> None:
        by_engine: dict[int, list[str]] = {}
        for request_id in request_ids:
            index = self._forget(request_id)
            if index is not None:
                by_engine.setdefault(index, []).append(request_id)
        for index, ids in by_engine.items():
            await self.engines[index].abort_requests(ids)

    async def utility(self, name: str) -> None:
        check_utility(name)
        for engine in self.engines:
            await engine.utility(name)

    async def call(self, name: str, *args: Any) -> Any:
        """Every engine runs the call; the first one's answer (they are run alike)."""
        check_call(name)
        answers = await asyncio.gather(*(engine.call(name, *args) for engine in self.engines))
        return answers[0]

    async def get_outputs(self) -> EngineCoreOutputs:
        """The next outputs of any engine; EngineDeadError as soon as one engine dies."""
        for index, engine in enumerate(self.engines):
            if index not in self._waiting:
                self._waiting[index] = asyncio.create_task(engine.get_outputs())
        done, _ = await asyncio.wait(self._waiting.values(), return_when=asyncio.FIRST_COMPLETED)
        index = next(i for i, task in self._waiting.items() if task in done)
        task = self._waiting.pop(index)
        try:
            outputs = task.result()
        except EngineDeadError as exc:
            self.dead_reason = f"data-parallel engine {index}: {exc}"
            raise EngineDeadError(self.dead_reason) from exc
        if outputs.start_wave is not None:
            for other, engine in enumerate(self.engines):
                if other != index:
                    await engine.start_wave(outputs.start_wave)
        for output in outputs.outputs:
            if output.finish_reason is not None:
                self._forget(output.request_id)
        for request_id in outputs.finished_requests:
            self._forget(request_id)
        if outputs.scheduler_stats is not None:
            self._stats[index] = outputs.scheduler_stats
        return outputs

    def _forget(self, request_id: str) -> int | None:
        """Stop counting a request against its engine; that engine (None: not known)."""
        index = self._owner.pop(request_id, None)
        if index is not None:
            self._load[index] -= 1
        return index

    def _check_alive(self) -> None:
        if self.dead_reason is not None:
            raise EngineDeadError(self.dead_reason)

    def heartbeat_age(self) -> float:
        return max(engine.heartbeat_age() for engine in self.engines)

    def shutdown(self) -> None:
        for task in self._waiting.values():
            task.cancel()
        for engine in self.engines:
            engine.shutdown()
