"""POST /v1/embeddings: one pooled vector per input, over a model served with --runner pooling.

Each input (a text or token ids) is one engine request; every input is validated before
any is queued, so a bad one is a 400 naming `input` (or `dimensions`) and nothing runs.
Vectors come back in the inputs' order, as floats or as base64 of their little-endian
float32 bytes (`encoding_format`, what the openai client asks for by default).
"""

from __future__ import annotations

import base64
from http import HTTPStatus

import numpy as np
from fastapi.responses import JSONResponse

from core.engine.async_llm import AsyncLLM
from core.engine.processor import PreparedRequest
from core.entrypoints.openai.errors import OpenAIError
from core.entrypoints.openai.final_outputs import final_outputs
from core.entrypoints.openai.offload import OffLoop
from core.entrypoints.openai.params import field_error
from core.entrypoints.openai.protocol_embeddings import (
    Embedding,
    EmbeddingRequest,
    EmbeddingResponse,
    EmbeddingUsage,
)
from core.entrypoints.openai.serving_models import ServedModels
from core.pooling.params import PoolingParams

__all__ = ["ServingEmbeddings"]

# The request's names for the fields the engine's validation names.
_RENAMES = {"prompt": "input", "dimensions": "dimensions"}


class ServingEmbeddings:
    def __init__(self, engine: AsyncLLM, models: ServedModels, offload: OffLoop) -> None:
        """`offload`: where inputs are tokenized (see OffLoop)."""
        self.engine = engine
        self.models = models
        self.offload = offload

    async def create(self, req: EmbeddingRequest) -> JSONResponse:
        lora = self.models.lora_request(req.model)  # a 404 for a model not served here
        try:
            self.engine.processor.require_runner("pooling")
        except ValueError as exc:
            raise OpenAIError(HTTPStatus.BAD_REQUEST, str(exc), param="model") from exc
        prepared = await self.offload.run(self._prepare, req)
        vectors = [o.outputs.embedding for o in await final_outputs(self.engine, prepared)]
        data = [
            Embedding(embedding=_encode(vector, req.encoding_format), index=i)
            for i, vector in enumerate(vectors)
        ]
        num_tokens = sum(len(request.prompt_token_ids) for request in prepared)
        response = EmbeddingResponse(
            model=self.models.model_name(lora),
            data=data,
            usage=EmbeddingUsage(prompt_tokens=num_tokens, total_tokens=num_tokens),
        )
        return JSONResponse(response.model_dump())

    def _prepare(self, req: EmbeddingRequest) -> list[PreparedRequest]:
        prompts = req.prompts()
        if not prompts:
            raise OpenAIError(HTTPStatus.BAD_REQUEST, "input must not be empty", param="input")
        try:
            params = PoolingParams(dimensions=req.dimensions)
            return [self.engine.processor.prepare(prompt, params) for prompt in prompts]
        except ValueError as exc:
            raise field_error(str(exc), _RENAMES) from exc


def _encode(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "float":
        return vector
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
