"""LLMEngine: the synchronous frontend over an in-process EngineCore.

Inputs are validated by the InputProcessor (so bad input is a ValueError and nothing is
queued); the OutputProcessor turns the engine core's token ids into RequestOutputs. The
engine core is reached through an InprocClient, whose calls never wait, run inline. Stat
loggers (the `core.stat_loggers` plugins' and those given) get every step's stats, and
`log()` between steps every CORE_LOG_STATS_INTERVAL seconds.
"""

from __future__ import annotations

from collections.abc import Sequence

from core.engine.core import EngineCore
from core.engine.core_client import InprocClient, run_inline
from core.engine.frontend import EngineFrontend
from core.engine.output_processor import OutputQueue, RequestOutputKind
from core.engine.processor import EngineSetup, PreparedRequest
from core.engine.stat_logger import StatLoggerFactory
from core.engine.stat_loggers import StatLoggers, stat_logger_factories
from core.engine_args import EngineArgs
from core.lora.request import LoRARequest
from core.outputs import RequestOutput
from core.sampling_params import SamplingParams


class LLMEngine(EngineFrontend):
    client: InprocClient

    def __init__(
        self, engine_args: EngineArgs, stat_loggers: Sequence[StatLoggerFactory] = ()
    ) -> None:
        setup = EngineSetup.from_engine_args(engine_args)
        if setup.config.parallel.data_parallel_size > 1:
            raise ValueError(
                "data_parallel_size > 1 is served by `core serve` (AsyncLLM); offline, run one "
                "LLM per process"
            )
        self.stat_loggers = StatLoggers(setup.config, stat_logger_factories(stat_loggers))
        # Without a logger no step's stats are gathered.
        listener = self.stat_loggers.record if self.stat_loggers else None
        super().__init__(setup, InprocClient(setup), stats_listener=listener)
        run_inline(self.client.start())
        self.stat_loggers.log_engine_initialized()

    @property
    def core(self) -> EngineCore:
        """The in-process engine core (introspection: scheduler, KV cache, executor)."""
        return self.client.core

    def add_prepared(
        self,
        request_id: str,
        prepared: PreparedRequest,
        output_kind: RequestOutputKind = RequestOutputKind.FINAL_ONLY,
        queue: OutputQueue | None = None,
        priority: int = 0,
        lora_request: LoRARequest | None = None,
    ) -> None:
        """Queue a prepared request; RuntimeError while the engine sleeps (nothing here could
        wake it while a step waited)."""
        if self.core.is_sleeping():
            raise RuntimeError("the engine is sleeping (sleep mode): call wake_up() first")
        run_inline(
            self._add_request(request_id, prepared, output_kind, queue, priority, lora_request)
        )

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        output_kind: RequestOutputKind = RequestOutputKind.FINAL_ONLY,
        priority: int = 0,
        lora_request: LoRARequest | None = None,
    ) -> None:
        prepared = self.prepare(prompt, params)
        self.add_prepared(request_id, prepared, output_kind, None, priority, lora_request)

    def abort_request(self, request_ids: list[str]) -> None:
        run_inline(self._abort(request_ids))

    def sleep(self, level: int = 1) -> None:
        """Sleep mode (--enable-sleep-mode; core.worker.sleep_mode): free the KV cache and
        offload (level 1) or drop (level 2) the weights until `wake_up`. Between requests
        only: RuntimeError while any is unfinished. ValueError, nothing done, without
        --enable-sleep-mode, for another level, or for a level 2 that would lose state."""
        if self.has_unfinished_requests():
            raise RuntimeError("sleep: requests are unfinished; finish or abort them first")
        run_inline(self.client.call("sleep", level))

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Bring back `tags` ("weights", "kv_cache"; None: both) after `sleep`."""
        run_inline(self.client.call("wake_up", tags))

    def is_sleeping(self) -> bool:
        return run_inline(self.client.call("is_sleeping"))

    def step(self) -> list[RequestOutput]:
        """Run one engine-core step; the outputs it completed (per output_kind)."""
        return run_inline(self._step())

    async def _step(self) -> list[RequestOutput]:
        outputs = await self.client.get_outputs()
        if self.stat_loggers:  # the state after the step, as an engine-core process sends it
            outputs.scheduler_stats = self.core.scheduler.make_stats()
        processed = await self._process_outputs(outputs)
        self.stat_loggers.log_when_due()
        return processed.request_outputs
