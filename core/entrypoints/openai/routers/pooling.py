"""POST /pooling: a request's raw data through the model's IO processor (see serving_pooling)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from core.entrypoints.openai.protocol_pooling import IOProcessorRequest
from core.entrypoints.openai.serving_pooling import ServingPooling

__all__ = ["pooling_router"]


def pooling_router(pooling: ServingPooling) -> APIRouter:
    router = APIRouter()

    @router.post("/pooling")
    async def create_pooling(req: IOProcessorRequest) -> JSONResponse:
        return await pooling.create(req)

    return router
