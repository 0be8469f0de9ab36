"""The server's HTTP middleware: CORS (--allowed-origins...) and the X-Request-Id echo.

Both are pure ASGI middleware: they wrap `send` and never buffer or re-read a body, so
streamed responses and client-disconnect detection work as without them.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core.entrypoints.openai.frontend_args import FrontendArgs

__all__ = ["REQUEST_ID_HEADER", "RequestIdEcho", "install_middleware"]

REQUEST_ID_HEADER = "X-Request-Id"


class RequestIdEcho:
    """Copies a request's X-Request-Id onto its response, on every route, so a client or
    proxy can match the two (the generation endpoints also use it as the engine request
    id: see request_options)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        value = Headers(scope=scope).get(REQUEST_ID_HEADER) if scope["type"] == "http" else None
        if value is None:
            await self.app(scope, receive, send)
            return

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)[REQUEST_ID_HEADER] = value
            await send(message)

        await self.app(scope, receive, send_with_id)


def install_middleware(app: FastAPI, frontend: FrontendArgs) -> None:
    """CORS as the frontend options say, and the X-Request-Id echo."""
    app.add_middleware(RequestIdEcho)
    app.add_middleware(
        CORSMiddleware,
        allow_origins=list(frontend.allowed_origins),
        allow_methods=list(frontend.allowed_methods),
        allow_headers=list(frontend.allowed_headers),
        allow_credentials=frontend.allow_credentials,
    )
