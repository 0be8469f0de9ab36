"""POST /pooling: a request's raw data through the model's IO processor, or a request with
`input` pooled for a task of the model (see serving_pooling)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import Discriminator, Tag

from core.entrypoints.openai.protocol_pooling import IOProcessorRequest, PoolingRequest
from core.entrypoints.openai.serving_pooling import ServingPooling

__all__ = ["pooling_router"]


def _kind(body: Any) -> str:
    """A body with `input` is plain pooling; any other goes to the IO processor (which
    says what its `data` must be). Tags are capitalized: an error's field path skips them."""
    plain = isinstance(body, PoolingRequest) or isinstance(body, dict) and "input" in body
    return "PoolingRequest" if plain else "IOProcessorRequest"


PoolingBody = Annotated[
    Annotated[PoolingRequest, Tag("PoolingRequest")]
    | Annotated[IOProcessorRequest, Tag("IOProcessorRequest")],
    Discriminator(_kind),
]


def pooling_router(pooling: ServingPooling) -> APIRouter:
    router = APIRouter()

    @router.post("/pooling")
    async def create_pooling(req: PoolingBody) -> JSONResponse:
        if isinstance(req, PoolingRequest):
            return await pooling.pool(req)
        return await pooling.create(req)

    return router
