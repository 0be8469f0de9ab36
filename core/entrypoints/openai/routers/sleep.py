"""vLLM's sleep-mode routes: POST /sleep?level=1, POST /wake_up (?tags=weights&tags=kv_cache)
and GET /is_sleeping ({"is_sleeping": bool}).

Sleeping aborts the requests in flight (vLLM's default mode, `mode=abort`); requests sent
while the engine sleeps wait until it is woken. Without --enable-sleep-mode, /sleep and
/wake_up are a 400 naming it (/is_sleeping answers false); the engine serves on.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Annotated, Literal

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, Response

from core.engine.async_llm import AsyncLLM

__all__ = ["sleep_router"]


def sleep_router(engine: AsyncLLM) -> APIRouter:
    router = APIRouter()

    @router.post("/sleep")
    async def sleep(level: int = 1, mode: Literal["abort"] = "abort") -> Response:
        await engine.sleep(level)
        return Response(status_code=HTTPStatus.OK)

    @router.post("/wake_up")
    async def wake_up(tags: Annotated[list[str] | None, Query()] = None) -> Response:
        await engine.wake_up(tags)
        return Response(status_code=HTTPStatus.OK)

    @router.get("/is_sleeping")
    async def is_sleeping() -> JSONResponse:
        return JSONResponse({"is_sleeping": await engine.is_sleeping()})

    return router
