"""LLMEngine: the synchronous frontend over an in-process EngineCore.

Inputs are validated by the InputProcessor (so bad input is a ValueError and nothing is
queued); the OutputProcessor turns the engine core's token ids into RequestOutputs. The
engine core is reached through an InprocClient, whose calls never wait, run inline.
"""

from __future__ import annotations

from core.engine.core import EngineCore
from core.engine.core_client import InprocClient, run_inline
from core.engine.frontend import EngineFrontend
from core.engine.output_processor import OutputQueue, RequestOutputKind
from core.engine.processor import EngineSetup, PreparedRequest
from core.engine_args import EngineArgs
from core.lora.request import LoRARequest
from core.outputs import RequestOutput
from core.sampling_params import SamplingParams


class LLMEngine(EngineFrontend):
    client: InprocClient

    def __init__(self, engine_args: EngineArgs) -> None:
        setup = EngineSetup.from_engine_args(engine_args)
        if setup.config.parallel.data_parallel_size > 1:
            raise ValueError(
                "data_parallel_size > 1 is served by `core serve` (AsyncLLM); offline, run one "
                "LLM per process"
            )
        super().__init__(setup, InprocClient(setup))
        run_inline(self.client.start())

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

    def step(self) -> list[RequestOutput]:
        """Run one engine-core step; the outputs it completed (per output_kind)."""
        return run_inline(self._step())

    async def _step(self) -> list[RequestOutput]:
        outputs = await self.client.get_outputs()
        return (await self._process_outputs(outputs)).request_outputs
