"""How `core serve` stops (lifecycle), over stand-ins for uvicorn's server and the engine:
a signal stops accepting at once and aborts what is left at the deadline; a second signal
aborts and forces at once; the engine core's death stops the server with exit code 1, or
not at all with CORE_KEEP_ALIVE_ON_ENGINE_DEATH; SIGINT and SIGTERM are caught as one, and
a stop during the engine's start cancels the start after its cleanup."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from core.entrypoints.openai.lifecycle import ServerLifecycle, StopSignals

TICK = 0.01
SLACK = 0.25  # scheduling delays on a shared 2-core machine


class StandInEngine:
    """What ServerLifecycle uses of AsyncLLM."""

    def __init__(self) -> None:
        self.dead = asyncio.Event()
        self.aborted_at: float | None = None

    async def wait_until_dead(self) -> None:
        await self.dead.wait()

    async def abort_all(self) -> None:
        self.aborted_at = time.monotonic()


class StandInServer:
    """What ServerLifecycle drives of uvicorn.Server. Its open requests never finish by
    themselves: once asked to exit, `serve` returns when the engine aborted them or when
    it is forced."""

    def __init__(self, engine: StandInEngine) -> None:
        self.engine = engine
        self.should_exit = False
        self.force_exit = False
        self.stopped_accepting_at: float | None = None

    async def serve(self) -> None:
        while not self.should_exit:
            await asyncio.sleep(TICK)
        self.stopped_accepting_at = time.monotonic()
        while self.engine.aborted_at is None and not self.force_exit:
            await asyncio.sleep(TICK)


def run(timeout_s: float, after_start) -> tuple[int, StandInServer, StandInEngine, float]:
    """Run a lifecycle; `after_start(signals, engine, server)` acts on it once it runs. Its
    exit code, the server, the engine, and when `after_start` was called."""

    async def main() -> tuple[int, StandInServer, StandInEngine, float]:
        engine = StandInEngine()
        server = StandInServer(engine)
        signals = StopSignals()
        lifecycle = ServerLifecycle(server, engine, signals, timeout_s)
        running = asyncio.create_task(lifecycle.run())
        await asyncio.sleep(0.05)
        started = time.monotonic()
        await after_start(signals, engine, server)
        return await asyncio.wait_for(running, 10), server, engine, started

    return asyncio.run(main())


async def stop(signals: StopSignals, engine: StandInEngine, server: StandInServer) -> None:
    signals.requested.set()


async def die(signals: StopSignals, engine: StandInEngine, server: StandInServer) -> None:
    engine.dead.set()


def test_a_stop_stops_accepting_at_once_and_aborts_at_the_deadline():
    exit_code, server, engine, started = run(0.5, stop)
    assert exit_code == 0
    assert server.stopped_accepting_at - started < SLACK
    assert 0.5 <= engine.aborted_at - started < 0.5 + SLACK
    assert not server.force_exit


def test_a_second_signal_aborts_and_forces_at_once():
    async def twice(signals: StopSignals, engine: StandInEngine, _) -> None:
        signals.requested.set()
        await asyncio.sleep(0.1)
        signals.forced.set()

    exit_code, server, engine, started = run(30, twice)
    assert exit_code == 0 and server.force_exit
    assert engine.aborted_at - started < 0.1 + SLACK


@pytest.mark.parametrize("keep_alive", ["", "0"])
def test_the_engines_death_stops_the_server_with_exit_code_1(monkeypatch, keep_alive):
    monkeypatch.setenv("CORE_KEEP_ALIVE_ON_ENGINE_DEATH", keep_alive)
    exit_code, server, engine, started = run(0, die)
    assert exit_code == 1
    assert server.stopped_accepting_at - started < SLACK


def test_keep_alive_on_engine_death_serves_until_a_signal(monkeypatch):
    monkeypatch.setenv("CORE_KEEP_ALIVE_ON_ENGINE_DEATH", "1")
    serving_after_death: list[bool] = []

    async def die_then_stop(signals: StopSignals, engine: StandInEngine, server) -> None:
        await die(signals, engine, server)
        await asyncio.sleep(0.3)
        serving_after_death.append(not server.should_exit)
        signals.requested.set()

    exit_code, server, _, started = run(0, die_then_stop)
    assert serving_after_death == [True] and exit_code == 0
    assert server.stopped_accepting_at - started >= 0.3


def test_sigterm_then_sigint_request_then_force_a_stop():
    async def main() -> tuple[bool, bool, bool]:
        with StopSignals() as signals:
            signal.raise_signal(signal.SIGTERM)
            await asyncio.wait_for(signals.requested.wait(), 5)
            forced_by_one = signals.forced.is_set()
            signal.raise_signal(signal.SIGINT)
            await asyncio.wait_for(signals.forced.wait(), 5)
        return forced_by_one, signals.requested.is_set(), signals.forced.is_set()

    assert asyncio.run(main()) == (False, True, True)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_stop_during_the_start_cancels_it_after_its_cleanup():
    cleaned: list[str] = []

    async def start(seconds: float) -> str:
        try:
            await asyncio.sleep(seconds)
            return "engine"
        finally:
            cleaned.append(f"start of {seconds} s")

    async def main() -> tuple[str | None, str | None]:
        with StopSignals() as signals:
            quick = await signals.unless_requested(start(0))
            asyncio.get_running_loop().call_later(0.05, signals.requested.set)
            slow = await signals.unless_requested(start(30))
        return quick, slow

    assert asyncio.run(main()) == ("engine", None)
    assert cleaned == ["start of 0 s", "start of 30 s"]
