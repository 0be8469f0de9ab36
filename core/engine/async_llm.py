"""AsyncLLM: the asyncio frontend over an engine-core process.

Tokenizing, validating and detokenizing stay here; the engine core steps in its own
process, reached through an MPClient. Each request streams through its own asyncio queue;
a consumer that stops listening (a client disconnect cancels its task) aborts its request.
When the engine-core process dies, every waiting request fails at once with
EngineDeadError, `is_healthy` turns False and `wait_until_dead` returns. Every engine step's
IterationStats (and every request aborted here) reaches each of `stats_listeners`, e.g. the
server's metrics, and the stat loggers (`stat_loggers`: the `core.stat_loggers` plugins' and
those given to `start`, whose `log()` runs every CORE_LOG_STATS_INTERVAL seconds).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Sequence

from core import envs
from core.beam_search import BeamSearchParams, beam_search, request_output
from core.config import UsageContext
from core.engine.core_client import EngineDeadError, MPClient
from core.engine.dp_client import DPClient
from core.engine.frontend import EngineFrontend
from core.engine.output_processor import RequestOutputKind
from core.engine.processor import EngineSetup, PreparedRequest
from core.engine.stat_logger import StatLoggerFactory
from core.engine.stat_loggers import StatLoggers, stat_logger_factories
from core.engine.stats import IterationStats, StatsListener
from core.engine_args import EngineArgs
from core.lora.request import LoRARequest
from core.outputs import RequestOutput
from core.sampling_params import SamplingParams
from core.worker.sleep_mode import check_sleep, wake_tags

logger = logging.getLogger(__name__)


class AsyncLLM(EngineFrontend):
    def __init__(self, setup: EngineSetup, stat_loggers: Sequence[StatLoggerFactory] = ()) -> None:
        dp_size = setup.config.parallel.data_parallel_size
        self.stat_loggers = StatLoggers(setup.config, stat_logger_factories(stat_loggers))
        self.stats_listeners: list[StatsListener] = [self.stat_loggers.record]
        client = DPClient(setup, dp_size) if dp_size > 1 else MPClient(setup)
        super().__init__(setup, client, stats_listener=self._publish_stats)
        self.num_gpu_blocks: int | None = None  # KV blocks per engine core, once started
        self._queues: dict[str, asyncio.Queue] = {}
        self._output_task: asyncio.Task | None = None
        self._log_task: asyncio.Task | None = None
        self._dead = asyncio.Event()
        self._aborting_all = False  # set by abort_all: every request is aborted once added
        # Clear while the engine sleeps (or goes to sleep): new requests wait for it.
        self._awake = asyncio.Event()
        self._awake.set()

    @classmethod
    async def start(
        cls, engine_args: EngineArgs, stat_loggers: Sequence[StatLoggerFactory] = ()
    ) -> AsyncLLM:
        """Resolve the configuration, spawn the engine core, return once it is ready.
        `stat_loggers`: StatLoggerBase classes (or factories) besides the plugins'."""
        setup = EngineSetup.from_engine_args(engine_args, UsageContext.SERVING)
        engine = cls(setup, stat_loggers)
        try:
            info = await engine.client.start()
        except BaseException:
            engine.client.shutdown()
            raise
        logger.info("engine core ready (pid %s, %s KV blocks)", info["pid"], info["num_blocks"])
        engine.num_gpu_blocks = info["num_blocks"]
        engine._output_task = asyncio.create_task(engine._output_loop())
        engine.stat_loggers.log_engine_initialized()
        engine._log_task = asyncio.create_task(engine._log_loop())
        return engine

    def heartbeat_age(self) -> float | None:
        """Seconds since the engine core was last heard from (None: it runs in this
        process); see EngineCoreClient.heartbeat_age."""
        return self.client.heartbeat_age()

    @property
    def is_healthy(self) -> bool:
        return self.client.is_alive

    def check_healthy(self) -> None:
        """EngineDeadError (with the reason) when the engine core cannot serve."""
        if not self.is_healthy:
            raise EngineDeadError(self.client.dead_reason)

    async def wait_until_dead(self) -> None:
        """Return once the engine core has died (every waiting request has been handed its
        EngineDeadError); never while it serves, nor after `shutdown`, which is no death."""
        await self._dead.wait()

    async def generate(
        self,
        request_id: str,
        prepared: PreparedRequest,
        output_kind: RequestOutputKind = RequestOutputKind.DELTA,
        priority: int = 0,
        lora_request: LoRARequest | None = None,
        cache_salt: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Yield the request's outputs until it finishes; aborts it if the consumer leaves.

        `lora_request`: the adapter to run with (None: the base model); ValueError when it
        cannot be served (see InputProcessor.check_lora). `cache_salt`: requests with
        different salts never share prefix-cache blocks.
        """
        self.check_healthy()
        if not self._awake.is_set():  # vLLM's: a request sent while the engine sleeps waits
            await self._awake.wait()
            self.check_healthy()
        if request_id in self._queues:
            # Refused before anything is registered: the request in flight under this id
            # keeps its queue and is never aborted on this one's behalf.
            raise ValueError(f"request_id {request_id!r} is already in use")
        queue: asyncio.Queue = asyncio.Queue()
        self._queues[request_id] = queue
        finished = False
        try:
            await self._add_request(
                request_id, prepared, output_kind, queue, priority, lora_request, cache_salt
            )
            if self._aborting_all:  # it arrived after the deadline: its final output is "abort"
                await self.abort(request_id)
            while not finished:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
        finally:
            self._queues.pop(request_id, None)
            if not finished:  # cancelled, disconnected or failed: free its engine state
                await self.abort(request_id)

    async def abort(self, request_id: str) -> None:
        await self._abort([request_id])

    async def abort_all(self) -> None:
        """Abort every request in flight, and from now on every request as soon as it is
        added (a stopping server's deadline): each one's final output has finish_reason
        "abort", so whoever consumes it ends cleanly."""
        self._aborting_all = True
        self._awake.set()  # those waiting for a sleeping engine end too
        await self._abort(list(self._queues))

    async def reset_prefix_cache(self) -> None:
        await self.client.utility("reset_prefix_cache")

    async def beam_search(
        self,
        request_id: str,
        prepared: PreparedRequest,
        params: BeamSearchParams,
        priority: int = 0,
        lora_request: LoRARequest | None = None,
        cache_salt: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Yield the one, final output of a beam search (core.beam_search) from `prepared`'s
        prompt, which leaves room for `params.max_tokens`: `params.beam_width` outputs, best
        first. Each step's beams run as requests of their own, concurrently, with this
        request's priority, adapter and cache salt."""
        step_ids = itertools.count()

        async def run(beam: list[int], step_params: SamplingParams) -> RequestOutput:
            step = self.processor.prepare(beam, step_params)
            outputs = self.generate(
                f"{request_id}-beam-{next(step_ids)}", step, RequestOutputKind.FINAL_ONLY,
                priority, lora_request, cache_salt,
            )  # fmt: skip
            return [output async for output in outputs][-1]

        async def step(beams: list[tuple[int, list[int]]], step_params: SamplingParams) -> list:
            return await asyncio.gather(*(run(tokens, step_params) for _, tokens in beams))

        prompt_ids = prepared.prompt_token_ids
        [found] = await beam_search([prompt_ids], params, step, self.tokenizer.eos_token_id)
        yield request_output(request_id, prepared.prompt, prompt_ids, found, self.tokenizer.decode)

    async def sleep(self, level: int = 1) -> None:
        """Sleep mode (--enable-sleep-mode; core.worker.sleep_mode): abort every request in
        flight (vLLM's default mode), then have every worker free its KV cache and
        offload (level 1) or drop (level 2) its weights. Requests sent meanwhile wait for
        `wake_up`. ValueError, nothing done, without --enable-sleep-mode, for another
        level, or for a level 2 that would lose state."""
        check_sleep(self.config, level)
        self._awake.clear()
        await self._abort(list(self._queues))
        try:
            await self.client.call("sleep", level)
        except ValueError:  # refused before anything slept
            self._awake.set()
            raise

    async def wake_up(self, tags: list[str] | None = None) -> None:
        """Bring back `tags` ("weights", "kv_cache"; None: both); once nothing sleeps, the
        requests that waited go in. ValueError without --enable-sleep-mode or for
        another tag."""
        wake_tags(tags)
        await self.client.call("wake_up", None if tags is None else list(tags))
        if not await self.is_sleeping():
            self._awake.set()

    async def is_sleeping(self) -> bool:
        return await self.client.call("is_sleeping")

    async def _output_loop(self) -> None:
        try:
            while True:
                outputs = await self.client.get_outputs()
                await self._process_outputs(outputs)
        except EngineDeadError as exc:
            self._on_engine_death(str(exc))
        except asyncio.CancelledError:
            pass

    async def _log_loop(self) -> None:
        while True:
            await asyncio.sleep(envs.log_stats_interval())
            self.stat_loggers.log()

    def _publish_stats(self, stats: IterationStats) -> None:
        for listener in self.stats_listeners:
            listener(stats)

    def _on_engine_death(self, reason: str) -> None:
        logger.error("%s; failing %d waiting requests", reason, len(self._queues))
        for queue in self._queues.values():
            queue.put_nowait(EngineDeadError(reason))
        self._awake.set()  # those waiting for a sleeping engine fail too
        self._dead.set()

    def shutdown(self) -> None:
        for task in (self._output_task, self._log_task):
            if task is not None:
                task.cancel()
        super().shutdown()
