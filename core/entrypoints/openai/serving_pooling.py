"""POST /pooling: a request's raw `data` answered by the model's IO processor, or (a request
with `input`, `ServingPooling.pool`) each input pooled for a task of the model (core.
pooling.tasks), its output as the response's `data` (vLLM's plain pooling).

The processor (core.io_processors, named by --io-processor-plugin or config.json) parses the
data and turns it into prompts; each prompt is one engine request (generated under
--runner generate, pooled under --runner pooling), all validated before any is queued; the
finished outputs go back to the processor, whose answer is the response's `data`. Data the
processor or the engine refuses is a 400 naming `data`; a server without an IO processor
answers every request with a 400 saying how to configure one. A processor that breaks its
contract (a prompt of the wrong shape, an answer JSON cannot carry) is a 500, logged.
"""

from __future__ import annotations

import uuid
from functools import partial
from http import HTTPStatus

from fastapi.responses import JSONResponse

from core.engine.async_llm import AsyncLLM
from core.engine.processor import PreparedRequest
from core.entrypoints.openai.errors import OpenAIError
from core.entrypoints.openai.final_outputs import final_outputs
from core.entrypoints.openai.offload import OffLoop
from core.entrypoints.openai.protocol_pooling import (
    IOProcessorRequest,
    IOProcessorResponse,
    PoolingRequest,
    PoolingResponse,
    PoolingResponseData,
)
from core.entrypoints.openai.serving_models import ServedModels
from core.entrypoints.openai.serving_pooled import (
    encode_floats,
    prepare_inputs,
    require_task,
    usage,
)
from core.io_processors import (
    IOProcessor,
    Params,
    PromptParts,
    prompt_parts,
    require_io_processor,
)
from core.outputs import (
    ClassificationOutput,
    EmbeddingOutput,
    PoolingRequestOutput,
    ScoringOutput,
)

__all__ = ["ServingPooling"]


class ServingPooling:
    def __init__(self, engine: AsyncLLM, models: ServedModels, offload: OffLoop) -> None:
        """`offload`: where the processor parses data and prompts are tokenized (OffLoop)."""
        self.engine = engine
        self.models = models
        self.offload = offload

    async def create(self, req: IOProcessorRequest) -> JSONResponse:
        lora = self.models.lora_request(req.model)  # a 404 for a model not served here
        # None configured: a ValueError, the 400 of every request (errors.as_openai_error).
        processor = require_io_processor(self.engine.processor.io_processor)
        request_id = req.request_id or f"pooling-{uuid.uuid4().hex}"
        data, params = await self.offload.run(_parse, processor, req.data)
        try:
            prompts = await processor.pre_process_async(data, request_id)
        except ValueError as exc:
            raise _data_error(exc) from exc
        prepared = await self.offload.run(self._prepare, prompt_parts(prompts), params)
        outputs = await final_outputs(self.engine, prepared, lora)
        answer = await processor.post_process_async(outputs, request_id)
        response = IOProcessorResponse(
            request_id=request_id, data=processor.output_to_response(answer)
        )
        return JSONResponse(response.model_dump())

    async def pool(self, req: PoolingRequest) -> JSONResponse:
        """Each input of `req` pooled for its task; a 400 naming the task when the model
        does not serve it, or naming `input` or the parameter at fault."""
        lora = self.models.lora_request(req.model)
        task = require_task(self.engine, req.task, "task" if req.task else "model")
        prepare = partial(
            prepare_inputs,
            task=task,
            dimensions=req.dimensions,
            normalize=req.normalize,
            use_activation=req.use_activation,
        )
        prepared = await self.offload.run(prepare, self.engine, req.prompts())
        outputs = await final_outputs(self.engine, prepared)
        data = [
            PoolingResponseData(index=i, data=encode_floats(_values(o), req.encoding_format))
            for i, o in enumerate(outputs)
        ]
        response = PoolingResponse(
            model=self.models.model_name(lora), data=data, usage=usage(outputs)
        )
        return JSONResponse(response.model_dump())

    def _prepare(self, prompts: list[PromptParts], params: Params) -> list[PreparedRequest]:
        try:
            return [
                self.engine.processor.prepare(p.prompt, params, p.multi_modal_data) for p in prompts
            ]
        except ValueError as exc:
            raise _data_error(exc) from exc


def _parse(processor: IOProcessor, data: object) -> tuple[object, Params]:
    """The processor's parsed data and the engine requests' parameters."""
    try:
        return processor.parse_request(data), processor.validate_or_generate_params()
    except ValueError as exc:
        raise _data_error(exc) from exc


def _values(output: PoolingRequestOutput) -> list[float] | list[list[float]]:
    """A pooled output's values as JSON carries them (a score: a one-value list)."""
    result = output.outputs
    if isinstance(result, EmbeddingOutput):
        return result.embedding
    if isinstance(result, ClassificationOutput):
        return result.probs
    if isinstance(result, ScoringOutput):
        return [result.score]
    return result.data.tolist()


def _data_error(exc: ValueError) -> OpenAIError:
    return OpenAIError(HTTPStatus.BAD_REQUEST, str(exc), param="data")
