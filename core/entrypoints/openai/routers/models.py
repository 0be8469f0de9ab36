"""GET /v1/models: the base model and the LoRA adapters served, as OpenAI's model list;
GET /v1/models/{id}: one of them (the openai client's `models.retrieve`)."""

from __future__ import annotations

from http import HTTPStatus

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from core.entrypoints.openai import protocol as p
from core.entrypoints.openai.errors import OpenAIError
from core.entrypoints.openai.serving_models import ServedModels

__all__ = ["models_router"]


def models_router(models: ServedModels) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/models")
    async def list_models() -> JSONResponse:
        return JSONResponse(p.ModelList(data=models.cards()).model_dump())

    @router.get("/v1/models/{model_id:path}")  # ids may hold slashes (org/name)
    async def retrieve_model(model_id: str) -> JSONResponse:
        for card in models.cards():
            if card.id == model_id:
                return JSONResponse(card.model_dump())
        raise OpenAIError(
            HTTPStatus.NOT_FOUND,
            f"The model '{model_id}' does not exist.",
            type="NotFoundError",
            param="model",
            code="model_not_found",
        )

    return router
