"""GET /v1/models: the base model and the LoRA adapters served, as OpenAI's model list."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from core.entrypoints.openai import protocol as p
from core.entrypoints.openai.serving_models import ServedModels

__all__ = ["models_router"]


def models_router(models: ServedModels) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/models")
    async def list_models() -> JSONResponse:
        return JSONResponse(p.ModelList(data=models.cards()).model_dump())

    return router
