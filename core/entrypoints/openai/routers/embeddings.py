"""POST /v1/embeddings (see serving_embeddings)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from core.entrypoints.openai.protocol_embeddings import EmbeddingRequest
from core.entrypoints.openai.serving_embeddings import ServingEmbeddings

__all__ = ["embeddings_router"]


def embeddings_router(embeddings: ServingEmbeddings) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/embeddings")
    async def create_embeddings(req: EmbeddingRequest) -> JSONResponse:
        return await embeddings.create(req)

    return router
