"""POST /score, /v1/score, /rerank, /v1/rerank and /v2/rerank (see serving_score)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from core.entrypoints.openai.protocol_score import RerankRequest, ScoreRequest
from core.entrypoints.openai.serving_score import ServingScores

__all__ = ["score_router"]


def score_router(scores: ServingScores) -> APIRouter:
    router = APIRouter()

    @router.post("/score")
    @router.post("/v1/score")
    async def create_score(req: ScoreRequest) -> JSONResponse:
        return await scores.score(req)

    # vLLM serves one (Jina's) shape on every rerank route, Cohere's v2 path included.
    @router.post("/rerank")
    @router.post("/v1/rerank")
    @router.post("/v2/rerank")
    async def rerank(req: RerankRequest) -> JSONResponse:
        return await scores.rerank(req)

    return router
