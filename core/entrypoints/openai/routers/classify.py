"""POST /classify (see serving_classify)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from core.entrypoints.openai.protocol_classify import ClassificationRequest
from core.entrypoints.openai.serving_classify import ServingClassification

__all__ = ["classify_router"]


def classify_router(classification: ServingClassification) -> APIRouter:
    router = APIRouter()

    @router.post("/classify")
    async def create_classification(req: ClassificationRequest) -> JSONResponse:
        return await classification.create(req)

    return router
