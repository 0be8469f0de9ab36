"""LLMEngine: the synchronous frontend over an in-process EngineCore.

Inputs are validated by the InputProcessor (so bad input is a ValueError and nothing is
queued); the OutputProcessor turns the engine core's token ids into RequestOutputs.
"""

from __future__ import annotations

import itertools

from core.engine.core import EngineCore
from core.engine.output_processor import OutputProcessor, OutputQueue, RequestOutputKind
from core.engine.processor import EngineSetup, InputProcessor, PreparedRequest
from core.engine_args import EngineArgs
from core.outputs import RequestOutput
from core.sampling_params import SamplingParams


class LLMEngine:
    def __init__(self, engine_args: EngineArgs) -> None:
        setup = EngineSetup.from_engine_args(engine_args)
        self.config = setup.config
        self.processor = InputProcessor(setup)
        self.tokenizer = self.processor.tokenizer
        self.core = EngineCore(setup.config, setup.platform, setup.checkpoint, setup.hooks)
        self.output_processor = OutputProcessor(self.tokenizer)
        self._ids = itertools.count()

    def new_request_id(self) -> str:
        return str(next(self._ids))

    def default_sampling_params(self) -> SamplingParams:
        return self.processor.default_sampling_params()

    def prepare(self, prompt: str | list[int], params: SamplingParams) -> PreparedRequest:
        return self.processor.prepare(prompt, params)

    def add_prepared(
        self,
        request_id: str,
        prepared: PreparedRequest,
        output_kind: RequestOutputKind = RequestOutputKind.FINAL_ONLY,
        queue: OutputQueue | None = None,
        priority: int = 0,
    ) -> None:
        request = self.processor.engine_core_request(request_id, prepared, priority)
        for child in self.output_processor.add_request(
            request, prepared.prompt, output_kind, queue
        ):
            self.core.add_request(child)

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        output_kind: RequestOutputKind = RequestOutputKind.FINAL_ONLY,
        priority: int = 0,
    ) -> None:
        self.add_prepared(request_id, self.prepare(prompt, params), output_kind, None, priority)

    def abort_request(self, request_ids: list[str]) -> None:
        self.core.abort_requests(self.output_processor.abort_requests(request_ids))

    def has_unfinished_requests(self) -> bool:
        return self.output_processor.has_unfinished_requests()

    def step(self) -> list[RequestOutput]:
        processed = self.output_processor.process_outputs(self.core.step())
        if processed.reqs_to_abort:  # finished here by a stop string
            self.core.abort_requests(processed.reqs_to_abort)
        return processed.request_outputs

    def shutdown(self) -> None:
        self.core.shutdown()
