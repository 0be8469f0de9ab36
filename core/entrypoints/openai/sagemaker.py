"""Amazon SageMaker's two routes, as vLLM serves them: GET or POST /ping is /health, and
POST /invocations is whichever API the body is for, chosen by its fields:

    messages -> /v1/chat/completions     prompt -> /v1/completions
    query and documents -> /rerank       text_1 -> /score
    input -> the model's pooling API (/v1/embeddings, /classify, or /pooling)

The body is read once (the body limit applies: this sits inside it) and handed on to the
route it is for, which parses, validates and answers it as when called by its own path.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from http import HTTPStatus
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core.entrypoints.openai.errors import OpenAIError, error_response

__all__ = ["SageMakerRoutes", "pooling_route"]


def pooling_route(tasks: Sequence[str]) -> str:
    """The route an /invocations body with `input` goes to, for a model with these pooling
    tasks (its default first)."""
    if tasks and tasks[0] == "embed":
        return "/v1/embeddings"
    if tasks and tasks[0] == "classify":
        return "/classify"
    return "/pooling"


class SageMakerRoutes:
    def __init__(self, app: ASGIApp, pooling: str) -> None:
        self.app = app
        self.pooling = pooling  # see pooling_route

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path.removeprefix(scope.get("root_path", "")) == "/ping":
            await self.app(_at(scope, "/health", method="GET"), receive, send)
        elif path.removeprefix(scope.get("root_path", "")) == "/invocations":
            await self._invoke(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _invoke(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await _read_body(receive)
        try:
            fields = json.loads(body)
        except (ValueError, RecursionError):
            fields = None  # the route it is for would say why; no route means none says it
        target = self._route_for(fields)
        if target is None or scope.get("method") != "POST":
            error = OpenAIError(
                HTTPStatus.BAD_REQUEST,
                "/invocations: the body must be a JSON object of a chat (messages), "
                "completion (prompt), rerank (query, documents), score (text_1, text_2) "
                "or pooling (input) request",
            )
            await error_response(error)(scope, receive, send)
            return
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: the client's disconnect

        await self.app(_at(scope, target), replay, send)

    def _route_for(self, fields: Any) -> str | None:
        if not isinstance(fields, dict):
            return None
        if "messages" in fields:
            return "/v1/chat/completions"
        if "prompt" in fields:
            return "/v1/completions"
        if "query" in fields and "documents" in fields:
            return "/rerank"
        if "text_1" in fields:
            return "/score"
        if "input" in fields:
            return self.pooling
        return None


def _at(scope: Scope, path: str, method: str | None = None) -> Scope:
    """`scope` for `path` (under the same root path), and `method` when given."""
    full = scope.get("root_path", "") + path
    moved = {**scope, "path": full, "raw_path": full.encode()}
    return moved if method is None else {**moved, "method": method}


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    return b"".join(chunks)
