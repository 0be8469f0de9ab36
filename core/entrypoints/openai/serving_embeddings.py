"""POST /v1/embeddings: one pooled vector per input, over a model served with --runner pooling.

Each input (a text or token ids) is one engine request; every input is validated before
any is queued, so a bad one is a 400 naming `input` (or `dimensions`) and nothing runs.
Vectors come back in the inputs' order, as floats or as base64 of their little-endian
float32 bytes (`encoding_format`, what the openai client asks for by default).
"""

from __future__ import annotations

from functools import partial

from fastapi.responses import JSONResponse

from core.engine.async_llm import AsyncLLM
from core.entrypoints.openai.final_outputs import final_outputs
from core.entrypoints.openai.offload import OffLoop
from core.entrypoints.openai.protocol_embeddings import (
    Embedding,
    EmbeddingRequest,
    EmbeddingResponse,
    EmbeddingUsage,
)
from core.entrypoints.openai.serving_models import ServedModels
from core.entrypoints.openai.serving_pooled import encode_floats, prepare_inputs, require_task

__all__ = ["ServingEmbeddings"]


class ServingEmbeddings:
    def __init__(self, engine: AsyncLLM, models: ServedModels, offload: OffLoop) -> None:
        """`offload`: where inputs are tokenized (see OffLoop)."""
        self.engine = engine
        self.models = models
        self.offload = offload

    async def create(self, req: EmbeddingRequest) -> JSONResponse:
        lora = self.models.lora_request(req.model)  # a 404 for a model not served here
        require_task(self.engine, "embed")
        prepare = partial(prepare_inputs, task="embed", dimensions=req.dimensions)
        prepared = await self.offload.run(prepare, self.engine, req.prompts())
        vectors = [o.outputs.embedding for o in await final_outputs(self.engine, prepared)]
        data = [
            Embedding(embedding=encode_floats(vector, req.encoding_format), index=i)
            for i, vector in enumerate(vectors)
        ]
        num_tokens = sum(len(request.prompt_token_ids) for request in prepared)
        response = EmbeddingResponse(
            model=self.models.model_name(lora),
            data=data,
            usage=EmbeddingUsage(prompt_tokens=num_tokens, total_tokens=num_tokens),
        )
        return JSONResponse(response.model_dump())
