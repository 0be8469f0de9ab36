"""The generation endpoints, /v1/completions and /v1/chat/completions (see serving)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from core.entrypoints.openai import protocol as p
from core.entrypoints.openai.serving import Serving

__all__ = ["generation_router"]


def generation_router(serving: Serving) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/completions")
    async def completions(req: p.CompletionRequest, raw: Request):
        return await serving.completions(req, raw)

    @router.post("/v1/chat/completions")
    async def chat(req: p.ChatCompletionRequest, raw: Request):
        return await serving.chat(req, raw)

    return router
