"""Several prepared requests run to their final outputs, all or none (a request of
/v1/embeddings or /pooling that needs one engine request per prompt)."""

from __future__ import annotations

import asyncio
from http import HTTPStatus

from core.engine.async_llm import AsyncLLM
from core.engine.output_processor import RequestOutputKind
from core.engine.processor import PreparedRequest
from core.entrypoints.openai.errors import OpenAIError
from core.lora.request import LoRARequest
from core.outputs import PoolingRequestOutput, RequestOutput

__all__ = ["final_outputs"]


async def final_outputs(
    engine: AsyncLLM, prepared: list[PreparedRequest], lora: LoRARequest | None = None
) -> list[RequestOutput | PoolingRequestOutput]:
    """The requests' final outputs, in order. The first failure is raised and cancels
    (aborts) the rest; a request the engine aborted (a stopping server) is a 503."""
    base = engine.new_request_id()
    tasks = [
        asyncio.create_task(_final_output(engine, f"{base}-{i}", request, lora))
        for i, request in enumerate(prepared)
    ]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:  # after a failure the others still run: cancelling aborts them
            task.cancel()


async def _final_output(
    engine: AsyncLLM, request_id: str, prepared: PreparedRequest, lora: LoRARequest | None
) -> RequestOutput | PoolingRequestOutput:
    final = None
    async for output in engine.generate(
        request_id, prepared, RequestOutputKind.FINAL_ONLY, lora_request=lora
    ):
        final = output
    if final is None or _aborted(final):
        raise OpenAIError(HTTPStatus.SERVICE_UNAVAILABLE, f"request {request_id} was aborted")
    return final


def _aborted(output: RequestOutput | PoolingRequestOutput) -> bool:
    """Whether the engine gave up on the request before it finished."""
    if isinstance(output, RequestOutput):
        return any(c.finish_reason == "abort" for c in output.outputs)
    return output.outputs is None
