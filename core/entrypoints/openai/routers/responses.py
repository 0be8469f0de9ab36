"""OpenAI's Responses API: create, retrieve and cancel a response (see serving_responses)."""

from __future__ import annotations

from http import HTTPStatus

from fastapi import APIRouter, Request

from core.entrypoints.openai.errors import OpenAIError
from core.entrypoints.openai.protocol_responses import ResponsesRequest
from core.entrypoints.openai.serving_responses import ServingResponses

__all__ = ["responses_router"]


def responses_router(serving: ServingResponses) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/responses")
    async def create(req: ResponsesRequest, raw: Request):
        return await serving.create(req, raw)

    @router.get("/v1/responses/{response_id}")
    async def retrieve(response_id: str, stream: bool = False, starting_after: int | None = None):
        # OpenAI's resumption of a background response's stream: its events are not kept.
        if stream or starting_after is not None:
            param = "stream" if stream else "starting_after"
            raise OpenAIError(
                HTTPStatus.BAD_REQUEST,
                f"{param}: a response's stream cannot be resumed here; retrieve it whole",
                param=param,
            )
        return await serving.retrieve(response_id)

    @router.post("/v1/responses/{response_id}/cancel")
    async def cancel(response_id: str):
        return await serving.cancel(response_id)

    return router
