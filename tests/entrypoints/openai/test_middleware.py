"""CORS as --allowed-origins says, and X-Request-Id echoed on every response."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI

from core.entrypoints.openai.frontend_args import FrontendArgs
from core.entrypoints.openai.middleware import install_middleware


def app_with(frontend: FrontendArgs) -> FastAPI:
    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> dict:
        return {"data": []}

    install_middleware(app, frontend, "/v1/embeddings")
    return app


async def request(app: FastAPI, method: str, headers: dict[str, str]) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        return await client.request(method, "/v1/models", headers=headers)


@pytest.mark.anyio
async def test_by_default_any_origin_is_allowed_as_vllm_allows_it():
    response = await request(app_with(FrontendArgs()), "GET", {"Origin": "https://ui.example"})
    assert response.headers["access-control-allow-origin"] == "*"


@pytest.mark.anyio
async def test_only_the_allowed_origins_get_cors_headers():
    app = app_with(FrontendArgs(allowed_origins=("https://ui.example",), allow_credentials=True))
    allowed = await request(app, "GET", {"Origin": "https://ui.example"})
    assert allowed.headers["access-control-allow-origin"] == "https://ui.example"
    assert allowed.headers["access-control-allow-credentials"] == "true"
    other = await request(app, "GET", {"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in other.headers
    preflight = await request(
        app,
        "OPTIONS",
        {"Origin": "https://evil.example", "Access-Control-Request-Method": "GET"},
    )
    assert preflight.status_code == 400


@pytest.mark.anyio
async def test_x_request_id_is_echoed_and_absent_when_not_sent():
    app = app_with(FrontendArgs())
    echoed = await request(app, "GET", {"X-Request-Id": "trace-42"})
    assert echoed.headers["x-request-id"] == "trace-42"
    assert "x-request-id" not in (await request(app, "GET", {})).headers
