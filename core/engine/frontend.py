"""EngineFrontend: what LLMEngine and AsyncLLM share — one construction, one request path.

A frontend is an InputProcessor (tokenize, render chat, validate: bad input is a
ValueError before anything is queued), an OutputProcessor (fan out n > 1, detokenize,
stop strings; a PoolingOutputProcessor for --runner pooling) and an EngineCoreClient, all
built here from one EngineSetup. Requests, aborts and outputs cross to the engine core
only through the client; its calls are coroutines, awaited by AsyncLLM and run inline by
LLMEngine (see core_client).
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Mapping
from typing import Any

from core.engine.core_client import EngineCoreClient
from core.engine.output_processor import (
    OutputProcessor,
    OutputProcessorOutput,
    OutputQueue,
    RequestOutputKind,
)
from core.engine.pooling_output import PoolingOutputProcessor
from core.engine.processor import EngineSetup, InputProcessor, PreparedRequest
from core.engine.protocol import EngineCoreOutputs
from core.engine.stats import StatsListener
from core.lora.request import LoRARequest
from core.pooling.params import PoolingParams
from core.reasoning import ReasoningParser, build_reasoning_parser
from core.sampling_params import SamplingParams


class EngineFrontend:
    def __init__(
        self,
        setup: EngineSetup,
        client: EngineCoreClient,
        stats_listener: StatsListener | None = None,
    ) -> None:
        self.config = setup.config
        self.processor = InputProcessor(setup)
        self.tokenizer = self.processor.tokenizer
        self.output_processor: OutputProcessor | PoolingOutputProcessor = (
            OutputProcessor(self.tokenizer, stats_listener)
            if setup.config.pooler is None
            else PoolingOutputProcessor(stats_listener)
        )
        self.client = client
        self._ids = itertools.count()
        # Built before the engine core starts: a tokenizer without the parser's markers
        # stops the start here, with the reason.
        name = setup.config.structured_outputs.reasoning_parser
        self.reasoning_parser: ReasoningParser | None = (
            None if name is None else build_reasoning_parser(name, self.tokenizer)
        )

    def new_request_id(self) -> str:
        """A fresh id: counted (logs read in order) and with a random part, so a client's
        X-Request-Id can neither guess nor collide with one the engine picked."""
        return f"req-{next(self._ids)}-{secrets.token_hex(8)}"

    def default_sampling_params(self) -> SamplingParams:
        return self.processor.default_sampling_params()

    def prepare(
        self,
        prompt: str | list[int],
        params: SamplingParams | PoolingParams,
        multi_modal_data: Mapping[str, Any] | None = None,
    ) -> PreparedRequest:
        return self.processor.prepare(prompt, params, multi_modal_data)

    def has_unfinished_requests(self) -> bool:
        return self.output_processor.has_unfinished_requests()

    async def _add_request(
        self,
        request_id: str,
        prepared: PreparedRequest,
        output_kind: RequestOutputKind,
        queue: OutputQueue | None,
        priority: int,
        lora_request: LoRARequest | None = None,
        cache_salt: str | None = None,
    ) -> None:
        """Track the request (its n samples as child requests) and send each child."""
        if lora_request is not None:
            self.processor.check_lora(lora_request)
        request = self.processor.engine_core_request(
            request_id, prepared, priority, cache_salt, lora_request
        )
        for child in self.output_processor.add_request(
            request, prepared.prompt, output_kind, queue
        ):
            await self.client.add_request(child)

    async def _abort(self, request_ids: list[str]) -> None:
        await self.client.abort_requests(self.output_processor.abort_requests(request_ids))

    async def _process_outputs(self, outputs: EngineCoreOutputs) -> OutputProcessorOutput:
        processed = self.output_processor.process_outputs(outputs)
        if processed.reqs_to_abort:  # finished here by a stop string
            await self.client.abort_requests(processed.reqs_to_abort)
        return processed

    def shutdown(self) -> None:
        self.client.shutdown()
