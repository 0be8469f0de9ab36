"""The server's HTTP middleware: CORS (--allowed-origins...), the X-Request-Id echo, the
request body limit (--max-request-body-bytes) and the cancellation of a request whose
client disconnected.

All are pure ASGI middleware: they wrap `send` or `receive` and never buffer or re-read a
body, so streamed responses and client-disconnect detection work as without them.
"""

from __future__ import annotations

import asyncio
from http import HTTPStatus

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from starlette.datastructures import Headers, MutableHeaders
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core.entrypoints.openai.errors import OpenAIError, error_response
from core.entrypoints.openai.frontend_args import FrontendArgs
from core.entrypoints.openai.offload import request_body_bytes
from core.entrypoints.openai.sagemaker import SageMakerRoutes

__all__ = [
    "REQUEST_ID_HEADER",
    "BodySizeLimit",
    "CancelOnDisconnect",
    "RequestIdEcho",
    "install_middleware",
]

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


class BodySizeLimit:
    """A 413 (OpenAI error body) for a request body over `max_bytes`, before the server
    parses it: at once when Content-Length declares more, else as soon as the received
    chunks pass the limit (a chunked upload), raised from `receive` to the route reading it.
    Parsing and validating a body holds the event loop, so the limit bounds that stall. The
    size received so far is `offload.request_body_bytes` in the route's context."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await error_response(self._error())(scope, receive, send)
            return
        received = 0

        async def receive_limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                request_body_bytes.set(received)  # read by OffLoop, in the route's context
                if received > self.max_bytes:
                    raise HTTPException(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, self._error().message)
            return message

        await self.app(scope, receive_limited, send)

    def _error(self) -> OpenAIError:
        return OpenAIError(
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
            f"the request body is over {self.max_bytes} bytes (the server's "
            "--max-request-body-bytes)",
        )


class CancelOnDisconnect:
    """Cancels a request's handling when its client disconnects, whatever the route: a
    non-streaming route (embeddings of 3,000 inputs, a long completion) awaits its engine
    requests without reading from the client, so nothing else would notice; cancelling its
    task aborts them. Watching starts once the body is in (the route no longer reads), with
    a `receive` of its own: after the body, an ASGI server answers every `receive` with the
    disconnect once it happens, so a streaming response's own watcher sees it too."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        watcher: asyncio.Task | None = None
        responded = asyncio.Event()  # the server answers `receive` with a disconnect then too

        async def receive_then_watch() -> Message:
            nonlocal watcher
            message = await receive()
            body_done = message["type"] == "http.request" and not message.get("more_body")
            if body_done and watcher is None:
                watcher = asyncio.create_task(_cancel_on_disconnect(receive, handling, responded))
            return message

        async def send_noting_the_end(message: Message) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body"):
                responded.set()
            await send(message)

        handling = asyncio.create_task(self.app(scope, receive_then_watch, send_noting_the_end))
        try:
            await handling
        except asyncio.CancelledError:
            if not handling.cancelled() or asyncio.current_task().cancelling():
                raise  # this task was cancelled (the server stops), not by the watcher
        finally:
            if watcher is not None:
                watcher.cancel()
            handling.cancel()


async def _cancel_on_disconnect(
    receive: Receive, handling: asyncio.Task, responded: asyncio.Event
) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    if not responded.is_set():
        handling.cancel()


def install_middleware(app: FastAPI, frontend: FrontendArgs, pooling_route: str) -> None:
    """The body limit, CORS as the frontend options say, the X-Request-Id echo, the
    cancellation of requests whose client left, and SageMaker's /ping and /invocations
    (`pooling_route`: where an /invocations body with `input` goes)."""
    app.add_middleware(CancelOnDisconnect)
    app.add_middleware(SageMakerRoutes, pooling=pooling_route)  # inside the body limit
    app.add_middleware(BodySizeLimit, max_bytes=frontend.max_request_body_bytes)
    app.add_middleware(RequestIdEcho)
    app.add_middleware(
        CORSMiddleware,
        allow_origins=list(frontend.allowed_origins),
        allow_methods=list(frontend.allowed_methods),
        allow_headers=list(frontend.allowed_headers),
        allow_credentials=frontend.allow_credentials,
    )
