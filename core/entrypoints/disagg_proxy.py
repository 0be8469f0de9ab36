"""The OpenAI-compatible front of prefill/decode disaggregation (`core disagg-proxy`).

Each completion or chat request makes two trips. The prefill engine gets the client's body
with ``max_tokens`` 1, no streaming and vLLM's ``do_remote_decode`` kv_transfer_params: it
computes the prompt's KV, keeps it for a decode engine to pull, and answers where to pull
it from (its own ``kv_transfer_params``). The decode engine then gets the client's original
body with those kv_transfer_params, and its answer goes back to the client unchanged,
streamed through as it arrives when the client asked for a stream. Engines of each side
are taken in turn (round robin). An engine's error answer is the client's answer; an
engine that cannot be reached is a 502 naming it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from http import HTTPStatus
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import StreamingResponse

from core.entrypoints.openai.errors import OpenAIError, error_response, install_error_handlers

__all__ = ["build_proxy_app", "serve_proxy"]

_COMPLETION_PATHS = ("/v1/completions", "/v1/chat/completions")

# What asks a prefill engine to keep the prompt's KV for a remote decode (vLLM's keys).
_REMOTE_DECODE = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}

# Left out of the prefill request: the client's stream settings (the prefill never
# streams), and min_tokens, since its one token is thrown away and a min_tokens above 1
# would make the engine refuse max_tokens 1.
_PREFILL_DROPPED = ("stream_options", "min_tokens")

# A probe that hangs is an unhealthy engine: /health must answer even when one does.
_HEALTH_TIMEOUT_S = 10.0


class _EnginePool:
    """The engines of one side ("prefill" or "decode"), taken in turn."""

    def __init__(self, side: str, urls: Sequence[str]) -> None:
        if not urls:
            raise ValueError(f"no {side} engine URL given")
        self.side = side
        self.urls = [url.rstrip("/") for url in urls]
        self._turn = itertools.cycle(self.urls)

    def next_url(self) -> str:
        return next(self._turn)


def build_proxy_app(
    prefill_urls: Sequence[str],
    decode_urls: Sequence[str],
    client: httpx.AsyncClient | None = None,
) -> FastAPI:
    """The proxy over these engines. A ``client`` given is the caller's to close; without
    one the app makes its own (connect timeout 10 s, no read timeout: a generation may take
    minutes) and closes it at shutdown. ValueError when either side has no URL."""
    prefill = _EnginePool("prefill", prefill_urls)
    decode = _EnginePool("decode", decode_urls)
    owned = client is None
    http = client or _default_client()

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        if owned:
            await http.aclose()

    app = FastAPI(title="core disagg-proxy", lifespan=lifespan)
    install_error_handlers(app)
    for path in _COMPLETION_PATHS:
        app.add_api_route(path, _completion_route(http, prefill, decode, path), methods=["POST"])

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        url = decode.urls[0]
        with _reaching(decode.side, url):
            answer = await http.get(f"{url}/v1/models", headers=_forwarded_headers(request))
        return _relayed(answer)

    @app.get("/health")
    async def health(request: Request) -> Response:
        unhealthy = await _unhealthy(http, (prefill, decode), _forwarded_headers(request))
        if unhealthy:
            message = f"unhealthy engines: {', '.join(unhealthy)}"
            return error_response(OpenAIError(HTTPStatus.SERVICE_UNAVAILABLE, message))
        return Response(status_code=HTTPStatus.OK)

    return app


def serve_proxy(
    prefill_urls: Sequence[str], decode_urls: Sequence[str], host: str, port: int
) -> None:
    """Run the proxy until interrupted."""
    uvicorn.run(build_proxy_app(prefill_urls, decode_urls), host=host, port=port)


def _default_client() -> httpx.AsyncClient:
    # No connection cap: every open stream holds a connection, and the engines, not the
    # proxy, decide how many requests they take.
    return httpx.AsyncClient(
        timeout=httpx.Timeout(None, connect=10.0),
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
    )


def _completion_route(
    http: httpx.AsyncClient, prefill: _EnginePool, decode: _EnginePool, path: str
) -> Callable[[Request], Awaitable[Response]]:
    """The handler of one completion path: prefill, then decode with the prefill's
    kv_transfer_params."""

    async def route(request: Request) -> Response:
        body = await _json_body(request)
        headers = _forwarded_headers(request)
        prefill_url = prefill.next_url()
        with _reaching(prefill.side, prefill_url):
            prefilled = await http.post(
                prefill_url + path, json=_prefill_body(body), headers=headers
            )
        if prefilled.is_error:
            return _relayed(prefilled)
        params = _kv_transfer_params(prefilled, prefill_url)
        return await _decode(http, decode, path, _decode_body(body, params), headers)

    return route


async def _decode(
    http: httpx.AsyncClient,
    decode: _EnginePool,
    path: str,
    body: dict[str, Any],
    headers: dict[str, str],
) -> Response:
    """The decode engine's answer: streamed through as it arrives when the client asked for
    a stream, else whole."""
    url = decode.next_url()
    with _reaching(decode.side, url):
        outgoing = http.build_request("POST", url + path, json=body, headers=headers)
        answer = await http.send(outgoing, stream=True)
    if body.get("stream") is True:
        return StreamingResponse(
            _relay(answer, url),
            status_code=answer.status_code,
            media_type=answer.headers.get("content-type", "text/event-stream"),
        )
    with _reaching(decode.side, url):
        try:
            await answer.aread()
        finally:
            await answer.aclose()
    return _relayed(answer)


async def _relay(answer: httpx.Response, url: str) -> AsyncIterator[bytes]:
    """The decode engine's SSE bytes as they arrive. If it drops the stream, the client's
    stream ends as core's own does on a failure: an error event, then [DONE]. Closing the
    engine's stream here, not after the response, also closes it when the client leaves,
    so the engine sees the disconnect and stops generating."""
    try:
        async for chunk in answer.aiter_bytes():
            yield chunk
    except httpx.TransportError as exc:
        error = _unreachable("decode", url, exc)
        # Blank lines first: an event the engine left half sent ends there, not in this one.
        yield f"\n\ndata: {json.dumps(error.body())}\n\ndata: [DONE]\n\n".encode()
    finally:
        await answer.aclose()


async def _json_body(request: Request) -> dict[str, Any]:
    """The client's JSON object; a 400 like core's server's when it is not one."""
    try:
        body = json.loads(await request.body())
    except ValueError as exc:
        raise OpenAIError(HTTPStatus.BAD_REQUEST, f"malformed JSON body: {exc}") from exc
    if not isinstance(body, dict):
        raise OpenAIError(HTTPStatus.BAD_REQUEST, "the request body must be a JSON object")
    return body


def _prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    """The client's body as a prefill-only request: one token, not streamed, its KV kept
    for a remote decode."""
    prefill = {key: value for key, value in body.items() if key not in _PREFILL_DROPPED}
    prefill.update(stream=False, max_tokens=1, kv_transfer_params=dict(_REMOTE_DECODE))
    if "max_completion_tokens" in body:
        prefill["max_completion_tokens"] = 1
    return prefill


def _decode_body(body: dict[str, Any], params: Any) -> dict[str, Any]:
    """The client's body carrying the prefill's kv_transfer_params (none when it gave none)."""
    decode = {key: value for key, value in body.items() if key != "kv_transfer_params"}
    if params is not None:
        decode["kv_transfer_params"] = params
    return decode


def _kv_transfer_params(prefilled: httpx.Response, url: str) -> Any:
    """The prefill answer's top-level kv_transfer_params, None when it has none."""
    try:
        answer = prefilled.json()
    except ValueError as exc:
        message = f"prefill engine {url} answered invalid JSON: {exc}"
        raise OpenAIError(HTTPStatus.BAD_GATEWAY, message) from exc
    return answer.get("kv_transfer_params") if isinstance(answer, dict) else None


def _forwarded_headers(request: Request) -> dict[str, str]:
    """The client's headers the engines need: its credentials (engines may run --api-key)."""
    authorization = request.headers.get("authorization")
    return {"Authorization": authorization} if authorization is not None else {}


def _relayed(answer: httpx.Response) -> Response:
    """An engine's whole answer (body, status, content type) as the client's."""
    return Response(
        answer.content,
        status_code=answer.status_code,
        media_type=answer.headers.get("content-type"),
    )


@contextlib.contextmanager
def _reaching(side: str, url: str) -> Iterator[None]:
    """Turn a failure to reach the engine at ``url`` into a 502 naming it."""
    try:
        yield
    except httpx.TransportError as exc:
        raise _unreachable(side, url, exc) from exc


def _unreachable(side: str, url: str, exc: httpx.TransportError) -> OpenAIError:
    reason = str(exc) or type(exc).__name__
    message = f"{side} engine {url} unreachable: {reason}"
    return OpenAIError(HTTPStatus.BAD_GATEWAY, message, code="engine_unreachable")


async def _unhealthy(
    http: httpx.AsyncClient, pools: Sequence[_EnginePool], headers: dict[str, str]
) -> list[str]:
    """``"<side> <url>"`` for every engine whose /health is not a 200, probed together."""
    engines = list(dict.fromkeys((pool.side, url) for pool in pools for url in pool.urls))
    probes = (_is_healthy(http, url, headers) for _, url in engines)
    healthy = await asyncio.gather(*probes)
    return [f"{side} {url}" for (side, url), ok in zip(engines, healthy, strict=True) if not ok]


async def _is_healthy(http: httpx.AsyncClient, url: str, headers: dict[str, str]) -> bool:
    try:
        answer = await http.get(f"{url}/health", headers=headers, timeout=_HEALTH_TIMEOUT_S)
    except httpx.TransportError:
        return False
    return answer.status_code == HTTPStatus.OK
