"""AsyncLLM's end of a request's life, over a scripted engine-core client (no process):
`abort_all` ends every request in flight, and every later one, with finish_reason
"abort"; a dead engine core fails the waiting requests, refuses new ones and wakes
`wait_until_dead`."""

from __future__ import annotations

import asyncio

import pytest
from tiny_engine_checkpoint import engine_args

from core.engine import async_llm
from core.engine.async_llm import AsyncLLM
from core.engine.core_client import EngineCoreClient, EngineDeadError
from core.engine.protocol import EngineCoreOutputs, EngineCoreRequest
from core.sampling_params import SamplingParams

DEATH = "engine core process exited (code -9)"


class ScriptedClient(EngineCoreClient):
    """An engine core that takes requests and never answers, until `kill` makes it die."""

    def __init__(self, setup, data_parallel_rank: int = 0) -> None:
        super().__init__()
        self.added: list[str] = []
        self.aborted: list[str] = []
        self._killed = asyncio.Event()

    async def start(self) -> dict:
        return {"pid": 0, "num_blocks": 8}

    async def add_request(self, request: EngineCoreRequest) -> None:
        self.added.append(request.request_id)

    async def abort_requests(self, request_ids: list[str]) -> None:
        self.aborted += request_ids

    async def utility(self, name: str) -> None:
        pass

    async def call(self, name: str, *args) -> None:
        pass

    async def get_outputs(self) -> EngineCoreOutputs:
        await self._killed.wait()
        self.dead_reason = DEATH
        raise EngineDeadError(DEATH)

    def kill(self) -> None:
        self._killed.set()

    def shutdown(self) -> None:
        pass


@pytest.fixture
def start(monkeypatch, tiny_checkpoint):
    monkeypatch.setattr(async_llm, "MPClient", ScriptedClient)
    return lambda: AsyncLLM.start(engine_args(tiny_checkpoint))


async def outputs(engine: AsyncLLM, request_id: str) -> list:
    """Every output of one request; the exception it ended with instead, if any."""
    prepared = engine.processor.prepare([3, 4, 5], SamplingParams(max_tokens=8))
    try:
        return [output async for output in engine.generate(request_id, prepared)]
    except EngineDeadError as exc:
        return [exc]


def test_abort_all_ends_every_request_in_flight_and_every_later_one_with_abort(start):
    async def run() -> None:
        engine = await start()
        try:
            running = [asyncio.create_task(outputs(engine, f"r{i}")) for i in range(2)]
            await asyncio.sleep(0.05)
            await engine.abort_all()
            late = await asyncio.wait_for(outputs(engine, "late"), 5)
            for ended in [*await asyncio.wait_for(asyncio.gather(*running), 5), late]:
                [final] = ended  # nothing was generated: one final output
                assert final.finished and final.outputs[0].finish_reason == "abort"
            assert sorted(engine.client.aborted) == ["late", "r0", "r1"]
        finally:
            engine.shutdown()

    asyncio.run(run())


def test_a_dead_engine_core_fails_the_waiting_refuses_the_new_and_wakes_its_watchers(start):
    async def run() -> None:
        engine = await start()
        try:
            waiting = asyncio.create_task(outputs(engine, "r0"))
            watcher = asyncio.create_task(engine.wait_until_dead())
            await asyncio.sleep(0.05)
            assert engine.is_healthy and not watcher.done()
            engine.client.kill()
            await asyncio.wait_for(watcher, 5)
            [error] = await asyncio.wait_for(waiting, 5)
            assert isinstance(error, EngineDeadError) and str(error) == DEATH
            assert not engine.is_healthy
            with pytest.raises(EngineDeadError, match="code -9"):
                engine.check_healthy()
            [refused] = await outputs(engine, "new")
            assert isinstance(refused, EngineDeadError)
            assert engine.client.added == ["r0"]
        finally:
            engine.shutdown()

    asyncio.run(run())
