"""How `core serve` stops: one path for SIGTERM and SIGINT, one for the engine core's death.

A stop signal while the engine core is starting cancels the start (the engine-core process
is stopped, its IPC directory removed) and `core serve` exits 0. While it serves, SIGTERM
and SIGINT alike:

1. stop accepting connections; idle keep-alive connections are closed, busy ones after
   their response (uvicorn's graceful shutdown);
2. let open requests finish for at most --shutdown-timeout seconds;
3. abort every engine request still running (AsyncLLM.abort_all): a stream ends with a
   final chunk whose finish_reason is "abort", then [DONE]; a non-streaming request gets a
   503 (see serving). A connection still open ABORT_GRACE_S later (a client that stopped
   reading) is cut by uvicorn;
4. stop the engine core and remove its IPC directory (AsyncLLM.shutdown, by the caller);
5. exit 0.

A second signal ends the drain at once: requests are aborted and the server stops without
waiting for their responses; step 4 still runs.

When the engine core dies, its in-flight requests fail at once (a 503, or a stream's last
SSE event, code "engine_dead") and new ones get 503. The server then stops as above (the
drain is short: every request has failed) and exits with EXIT_ENGINE_DEAD, so that a
supervisor restarts it; with CORE_KEEP_ALIVE_ON_ENGINE_DEATH it stays up answering 503
until a signal stops it (exit 0).

uvicorn's own signal handling is switched off (`Server.capture_signals`): it re-raises the
signal once `serve()` returns, which killed the process (code 143) before the engine core
was stopped and its IPC directory removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Coroutine, Iterator
from typing import Any, TypeVar

import uvicorn

from core import envs
from core.engine.async_llm import AsyncLLM

__all__ = ["ABORT_GRACE_S", "EXIT_ENGINE_DEAD", "ServerLifecycle", "StopSignals", "UvicornServer"]

logger = logging.getLogger(__name__)

EXIT_ENGINE_DEAD = 1  # the exit code after the engine core died (not 128 + a signal)
# How long aborted responses have to be written before uvicorn cuts their connections:
# uvicorn's timeout_graceful_shutdown is --shutdown-timeout plus this.
ABORT_GRACE_S = 1.0
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

T = TypeVar("T")


class StopSignals:
    """SIGINT and SIGTERM, caught on the running event loop while the context is entered:
    the first sets `requested`, a second `forced`. Leaving restores the default handlers."""

    def __init__(self) -> None:
        self.requested = asyncio.Event()
        self.forced = asyncio.Event()

    def __enter__(self) -> StopSignals:
        loop = asyncio.get_running_loop()
        for signum in _STOP_SIGNALS:
            loop.add_signal_handler(signum, self._on_signal, signum)
        return self

    def __exit__(self, *exc_info: object) -> None:
        loop = asyncio.get_running_loop()
        for signum in _STOP_SIGNALS:
            loop.remove_signal_handler(signum)

    def _on_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if self.requested.is_set():
            logger.warning("%s again: stopping now", name)
            self.forced.set()
        else:
            logger.info("%s: stopping", name)
            self.requested.set()

    async def unless_requested(self, work: Coroutine[Any, Any, T]) -> T | None:
        """`work`'s result; None when a stop is requested first, once `work` has been
        cancelled and has finished cleaning up."""
        task = asyncio.ensure_future(work)
        try:
            await _first(task, self.requested.wait())
        finally:
            task.cancel()  # does nothing once it is done
            await asyncio.wait((task,))
        return None if task.cancelled() else task.result()


class UvicornServer(uvicorn.Server):
    """uvicorn's server, without its signal handling: StopSignals owns SIGINT and SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class ServerLifecycle:
    """Runs `server` over `engine` until a signal or the engine core's death stops it, as
    the module docstring says; `run` returns the process's exit code."""

    def __init__(
        self,
        server: UvicornServer,
        engine: AsyncLLM,
        signals: StopSignals,
        shutdown_timeout: float,
    ) -> None:
        self.server = server
        self.engine = engine
        self.signals = signals
        self.shutdown_timeout = shutdown_timeout
        self.exit_code = 0

    async def run(self) -> int:
        stopper = asyncio.create_task(self._stop_when_asked())
        try:
            await self.server.serve()  # returns once uvicorn has drained (or was forced)
        finally:
            stopper.cancel()
        return self.exit_code

    async def _stop_when_asked(self) -> None:
        await _first(self.signals.requested.wait(), self.engine.wait_until_dead())
        if not self.signals.requested.is_set():
            await self._on_engine_death()
        self.server.should_exit = True  # uvicorn stops accepting and drains
        forced = self.signals.forced
        await _first(forced.wait(), asyncio.sleep(self.shutdown_timeout))
        logger.info("aborting the requests still running")
        await self.engine.abort_all()
        await forced.wait()
        self.server.force_exit = True  # uvicorn stops waiting for the aborted responses

    async def _on_engine_death(self) -> None:
        if envs.keep_alive_on_engine_death():
            logger.error(
                "the engine core died; serving 503 until stopped (CORE_KEEP_ALIVE_ON_ENGINE_DEATH)"
            )
            await self.signals.requested.wait()
        else:
            logger.error("the engine core died; stopping (exit code %d)", EXIT_ENGINE_DEAD)
            self.exit_code = EXIT_ENGINE_DEAD


async def _first(*waits: Awaitable[Any]) -> None:
    """Wait until one of `waits` is done; cancel the others this call wrapped in a task
    (a task passed in is left running)."""
    futures = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(futures, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for future, wait in zip(futures, waits, strict=True):
            if future is not wait:
                future.cancel()
