"""SageMaker's /ping and /invocations: each body reaches the route its fields are for, as
it would at that route's own path."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fastapi import FastAPI, Request

from core.entrypoints.openai.frontend_args import FrontendArgs
from core.entrypoints.openai.middleware import install_middleware
from core.entrypoints.openai.sagemaker import pooling_route

ROUTES = ["/v1/chat/completions", "/v1/completions", "/rerank", "/score", "/classify"]


def echo_app() -> FastAPI:
    """Each route answers {"route": its path, "body": the JSON it got}."""
    app = FastAPI()

    @app.get("/health")
    async def health() -> dict:
        return {"route": "/health"}

    for path in ROUTES:

        @app.post(path)
        async def echo(raw: Request, path: str = path) -> dict:
            return {"route": path, "body": await raw.json()}

    install_middleware(app, FrontendArgs(max_request_body_bytes=1024), "/classify")
    return app


def post(path: str, **kwargs) -> httpx.Response:
    transport = httpx.ASGITransport(app=echo_app())

    async def send() -> httpx.Response:
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.request(kwargs.pop("method", "POST"), path, **kwargs)

    return asyncio.run(send())


@pytest.mark.parametrize(
    ("body", "route"),
    [
        ({"messages": [{"role": "user", "content": "Hi"}]}, "/v1/chat/completions"),
        ({"prompt": "Hi", "max_tokens": 1}, "/v1/completions"),
        ({"query": "q", "documents": ["a", "b"]}, "/rerank"),
        ({"text_1": "a", "text_2": "b"}, "/score"),
        ({"input": ["a"]}, "/classify"),
    ],
)
def test_invocations_reach_the_route_their_fields_are_for(body, route):
    assert post("/invocations", json=body).json() == {"route": route, "body": body}


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_ping_is_health(method):
    assert post("/ping", method=method).json() == {"route": "/health"}


@pytest.mark.parametrize("content", [b"[1, 2]", b"{not json", b'{"neither": 1}'])
def test_a_body_for_no_route_is_a_400(content):
    answer = post("/invocations", content=content, headers={"content-type": "application/json"})
    assert answer.status_code == 400
    assert "/invocations: the body must be" in answer.json()["error"]["message"]


def test_the_body_limit_applies_to_invocations():
    answer = post("/invocations", json={"prompt": "x" * 2000})
    assert answer.status_code == 413


def test_the_pooling_route_is_the_models_default_task():
    assert pooling_route(("embed", "score")) == "/v1/embeddings"
    assert pooling_route(("classify", "score")) == "/classify"
    assert pooling_route(("token_classify",)) == "/pooling"
    assert pooling_route(()) == "/pooling"
