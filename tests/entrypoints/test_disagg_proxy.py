"""`core disagg-proxy`: each request is prefilled on one engine (one token, KV kept for a
remote decode), then decoded on another with the prefill's kv_transfer_params; engines of a
side taken in turn; the decode engine's answer, stream or error, reaches the client as it is.

The engines are small FastAPI stand-ins reached through an httpx transport that routes by
host; a URL no engine serves is refused as an unreachable host is."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from core.entrypoints import disagg_proxy
from core.entrypoints.cli import cli
from core.entrypoints.disagg_proxy import build_proxy_app

P1, P2 = "http://prefill-1:8100", "http://prefill-2:8100"
D1, D2 = "http://decode-1:8200", "http://decode-2:8200"
NOWHERE = "http://nowhere:9999"

REMOTE_DECODE = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
SSE_HEADERS = {"content-type": "text/event-stream"}
SSE_CHUNKS = [b'data: {"choices": [{"text": "a"}]}\n\n', b"data: [DONE]\n\n"]
COMPLETION = {"model": "m", "prompt": "hi", "max_tokens": 8, "temperature": 0}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 8}


@dataclass
class Seen:
    path: str
    body: dict[str, Any]
    authorization: str | None


class FakeEngine:
    """A `core serve` stand-in at ``url``. It records each completion request; answers a
    prefill request (do_remote_decode) with ``kv_transfer_params`` (left out when None),
    any other with its URL, or SSE_CHUNKS when asked to stream; ``error_status`` makes every
    completion an OpenAI error of that status; /health answers ``health_status``."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.seen: list[Seen] = []
        self.kv_transfer_params: dict[str, Any] | None = {"remote_engine_id": url}
        self.error_status: int | None = None
        self.health_status = 200
        self.app = FastAPI()
        self.app.add_api_route("/v1/completions", self._complete, methods=["POST"])
        self.app.add_api_route("/v1/chat/completions", self._complete, methods=["POST"])
        self.app.add_api_route("/v1/models", self._models)
        self.app.add_api_route("/health", self._health)

    async def _complete(self, request: Request) -> Response:
        body = await request.json()
        self.seen.append(Seen(request.url.path, body, request.headers.get("authorization")))
        if self.error_status is not None:
            error = {"message": f"refused by {self.url}", "type": "x", "param": None, "code": None}
            return JSONResponse({"error": error}, status_code=self.error_status)
        if (body.get("kv_transfer_params") or {}).get("do_remote_decode"):
            answer = {"id": "prefill", "kv_transfer_params": self.kv_transfer_params}
            return JSONResponse({k: v for k, v in answer.items() if v is not None})
        if body.get("stream"):
            return StreamingResponse(iter(SSE_CHUNKS), media_type="text/event-stream")
        return JSONResponse({"id": "decode", "engine": self.url})

    async def _models(self) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": self.url}]})

    async def _health(self) -> Response:
        return Response(status_code=self.health_status)


def routed(transports: dict[str, httpx.AsyncBaseTransport]) -> httpx.AsyncClient:
    """A client that sends each request to the transport of its URL's origin; other origins
    are refused as an unreachable host is."""

    async def route(request: httpx.Request) -> httpx.Response:
        transport = transports.get(f"{request.url.scheme}://{request.url.netloc.decode()}")
        if transport is None:
            raise httpx.ConnectError("connection refused", request=request)
        return await transport.handle_async_request(request)

    return httpx.AsyncClient(transport=httpx.MockTransport(route))


def proxy_app(
    prefill_urls: list[str],
    decode_urls: list[str],
    *engines: FakeEngine,
    by_url: dict[str, httpx.AsyncBaseTransport] | None = None,
) -> FastAPI:
    """The proxy over these URLs, reaching ``engines`` and the transports ``by_url``."""
    transports = {engine.url: httpx.ASGITransport(engine.app) for engine in engines}
    client = routed({**transports, **(by_url or {})})
    return build_proxy_app(prefill_urls, decode_urls, client=client)


def client_of(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://proxy")


async def post(app: FastAPI, path: str, body: Any, **headers: str) -> httpx.Response:
    async with client_of(app) as client:
        return await client.post(path, json=body, headers=headers)


async def get(app: FastAPI, path: str) -> httpx.Response:
    async with client_of(app) as client:
        return await client.get(path)


@pytest.mark.anyio
async def test_the_prefill_request_is_one_unstreamed_token_asking_for_a_remote_decode():
    prefill, decode = FakeEngine(P1), FakeEngine(D1)
    body = {**COMPLETION, "stream": True, "stream_options": {"include_usage": True}}
    await post(proxy_app([P1], [D1], prefill, decode), "/v1/completions", body)
    assert prefill.seen == [
        Seen(
            "/v1/completions",
            {**COMPLETION, "max_tokens": 1, "stream": False, "kv_transfer_params": REMOTE_DECODE},
            None,
        )
    ]


@pytest.mark.anyio
async def test_the_prefill_request_drops_min_tokens_which_would_exceed_its_one_token():
    prefill, decode = FakeEngine(P1), FakeEngine(D1)
    body = {**COMPLETION, "min_tokens": 4}
    await post(proxy_app([P1], [D1], prefill, decode), "/v1/completions", body)
    assert "min_tokens" not in prefill.seen[0].body
    assert decode.seen[0].body["min_tokens"] == 4


@pytest.mark.anyio
async def test_the_decode_request_is_the_original_body_with_the_prefills_kv_params():
    prefill, decode = FakeEngine(P1), FakeEngine(D1)
    answer = await post(proxy_app([P1], [D1], prefill, decode), "/v1/completions", COMPLETION)
    assert decode.seen == [
        Seen(
            "/v1/completions", {**COMPLETION, "kv_transfer_params": {"remote_engine_id": P1}}, None
        )
    ]
    assert answer.status_code == 200
    assert answer.json() == {"id": "decode", "engine": D1}


@pytest.mark.anyio
async def test_a_prefill_without_kv_params_leaves_them_out_of_the_decode_request():
    prefill, decode = FakeEngine(P1), FakeEngine(D1)
    prefill.kv_transfer_params = None
    body = {**COMPLETION, "kv_transfer_params": {"from": "client"}}
    await post(proxy_app([P1], [D1], prefill, decode), "/v1/completions", body)
    assert decode.seen[0].body == COMPLETION


@pytest.mark.anyio
async def test_requests_alternate_over_two_prefill_and_two_decode_engines():
    engines = [FakeEngine(url) for url in (P1, P2, D1, D2)]
    app = proxy_app([P1, P2], [D1, D2], *engines)
    for _ in range(4):
        await post(app, "/v1/completions", COMPLETION)
    p1, p2, d1, d2 = engines
    assert [len(engine.seen) for engine in engines] == [2, 2, 2, 2]
    assert [s.body["kv_transfer_params"]["remote_engine_id"] for s in d1.seen] == [P1, P1]
    assert [s.body["kv_transfer_params"]["remote_engine_id"] for s in d2.seen] == [P2, P2]


@pytest.mark.anyio
async def test_a_stream_passes_the_decode_engines_sse_bytes_through():
    prefill, decode = FakeEngine(P1), FakeEngine(D1)
    app = proxy_app([P1], [D1], prefill, decode)
    answer = await post(app, "/v1/completions", {**COMPLETION, "stream": True})
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/event-stream")
    assert answer.content == b"".join(SSE_CHUNKS)


@pytest.mark.anyio
async def test_each_sse_chunk_reaches_the_client_before_the_engine_sends_the_next():
    relayed_first = asyncio.Event()

    async def engine_stream():
        yield SSE_CHUNKS[0]
        await asyncio.wait_for(relayed_first.wait(), timeout=5)  # a buffering proxy times out
        yield SSE_CHUNKS[1]

    decode = httpx.MockTransport(
        lambda _: httpx.Response(200, content=engine_stream(), headers=SSE_HEADERS)
    )
    app = proxy_app([P1], [D1], FakeEngine(P1), by_url={D1: decode})
    parts: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        parts.append(message.get("body", b""))
        if message.get("body") == SSE_CHUNKS[0]:
            relayed_first.set()

    await asyncio.wait_for(_asgi_post(app, {**COMPLETION, "stream": True}, send), timeout=10)
    assert b"".join(parts) == b"".join(SSE_CHUNKS)


async def _asgi_post(app: FastAPI, body: dict[str, Any], send) -> None:
    """POST ``body`` to /v1/completions by calling the ASGI app itself, so that ``send``
    sees each part of the response as the app sends it (httpx's ASGI transport buffers)."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/completions",
        "raw_path": b"/v1/completions",
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json")],
        "server": ("proxy", 80),
        "client": ("client", 1),
    }
    request = {"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}

    async def receive() -> dict[str, Any]:
        return request

    await app(scope, receive, send)


@pytest.mark.anyio
async def test_a_stream_the_decode_engine_drops_ends_with_an_error_event_and_done():
    async def engine_stream():
        yield SSE_CHUNKS[0]
        raise httpx.ReadError("connection reset")

    decode = httpx.MockTransport(
        lambda _: httpx.Response(200, content=engine_stream(), headers=SSE_HEADERS)
    )
    app = proxy_app([P1], [D1], FakeEngine(P1), by_url={D1: decode})
    answer = await post(app, "/v1/completions", {**COMPLETION, "stream": True})
    events = [e for e in answer.content.split(b"\n\n") if e]
    assert events[0] + b"\n\n" == SSE_CHUNKS[0] and events[-1] == b"data: [DONE]"
    error = json.loads(events[-2].removeprefix(b"data: "))["error"]
    assert error["message"] == f"decode engine {D1} unreachable: connection reset"


@pytest.mark.anyio
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("failing", [P1, D1])
async def test_an_engines_error_answer_reaches_the_client_as_it_is(failing, stream):
    prefill, decode = FakeEngine(P1), FakeEngine(D1)
    {P1: prefill, D1: decode}[failing].error_status = 404
    app = proxy_app([P1], [D1], prefill, decode)
    answer = await post(app, "/v1/completions", {**COMPLETION, "stream": stream})
    assert answer.status_code == 404
    assert answer.json()["error"]["message"] == f"refused by {failing}"
    assert len(decode.seen) == (1 if failing == D1 else 0)


@pytest.mark.anyio
@pytest.mark.parametrize("side", ["prefill", "decode"])
async def test_an_unreachable_engine_is_a_502_naming_it(side):
    engine = FakeEngine(D1 if side == "prefill" else P1)
    urls = ([NOWHERE], [D1]) if side == "prefill" else ([P1], [NOWHERE])
    answer = await post(proxy_app(*urls, engine), "/v1/completions", COMPLETION)
    assert answer.status_code == 502
    assert answer.json() == {
        "error": {
            "message": f"{side} engine {NOWHERE} unreachable: connection refused",
            "type": "server_error",
            "param": None,
            "code": "engine_unreachable",
        }
    }


@pytest.mark.anyio
async def test_a_prefill_answer_that_is_not_json_is_a_502_naming_the_engine():
    prefill = httpx.MockTransport(lambda _: httpx.Response(200, text="<html>"))
    app = proxy_app([P1], [D1], FakeEngine(D1), by_url={P1: prefill})
    answer = await post(app, "/v1/completions", COMPLETION)
    assert answer.status_code == 502
    assert answer.json()["error"]["message"].startswith(f"prefill engine {P1} answered invalid")


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("content", "message"),
    [(b'{"prompt": ', "malformed JSON body: "), (b"[1]", "the request body must be")],
)
async def test_a_body_that_is_no_json_object_is_a_400_reaching_no_engine(content, message):
    prefill, decode = FakeEngine(P1), FakeEngine(D1)
    async with client_of(proxy_app([P1], [D1], prefill, decode)) as client:
        answer = await client.post("/v1/completions", content=content)
    assert answer.status_code == 400
    assert answer.json()["error"]["message"].startswith(message)
    assert prefill.seen == decode.seen == []


@pytest.mark.anyio
async def test_health_is_200_when_every_engine_is_healthy():
    engines = [FakeEngine(url) for url in (P1, P2, D1, D2)]
    answer = await get(proxy_app([P1, P2], [D1, D2], *engines), "/health")
    assert answer.status_code == 200


@pytest.mark.anyio
async def test_health_is_503_naming_each_unhealthy_or_unreachable_engine():
    p1, d1, d2 = FakeEngine(P1), FakeEngine(D1), FakeEngine(D2)
    d2.health_status = 500
    answer = await get(proxy_app([P1, NOWHERE], [D1, D2], p1, d1, d2), "/health")
    assert answer.status_code == 503
    message = answer.json()["error"]["message"]
    assert message == f"unhealthy engines: prefill {NOWHERE}, decode {D2}"


@pytest.mark.anyio
async def test_the_authorization_header_reaches_both_engines():
    prefill, decode = FakeEngine(P1), FakeEngine(D1)
    app = proxy_app([P1], [D1], prefill, decode)
    await post(app, "/v1/completions", COMPLETION, Authorization="Bearer sk-1")
    assert prefill.seen[0].authorization == decode.seen[0].authorization == "Bearer sk-1"


@pytest.mark.anyio
async def test_chat_completions_are_prefilled_and_decoded_the_same_way():
    prefill, decode = FakeEngine(P1), FakeEngine(D1)
    app = proxy_app([P1], [D1], prefill, decode)
    answer = await post(app, "/v1/chat/completions", CHAT)
    assert prefill.seen == [
        Seen(
            "/v1/chat/completions",
            {
                **CHAT,
                "max_completion_tokens": 1,
                "max_tokens": 1,
                "stream": False,
                "kv_transfer_params": REMOTE_DECODE,
            },
            None,
        )
    ]
    kv_params = {"remote_engine_id": P1}
    assert decode.seen == [
        Seen("/v1/chat/completions", {**CHAT, "kv_transfer_params": kv_params}, None)
    ]
    assert answer.json() == {"id": "decode", "engine": D1}


@pytest.mark.anyio
async def test_models_is_the_first_decode_engines_answer():
    engines = [FakeEngine(url) for url in (P1, D1, D2)]
    app = proxy_app([P1], [D1, D2], *engines)
    answers = [await get(app, "/v1/models") for _ in range(2)]
    assert [answer.json()["data"] for answer in answers] == [[{"id": D1}]] * 2


@pytest.mark.parametrize(("prefill_urls", "decode_urls"), [([], [D1]), ([P1], [])])
def test_a_side_without_engines_is_refused(prefill_urls, decode_urls):
    with pytest.raises(ValueError, match="engine URL given"):
        build_proxy_app(prefill_urls, decode_urls)


def test_the_command_serves_the_urls_given(monkeypatch):
    served = []
    monkeypatch.setattr(disagg_proxy, "serve_proxy", lambda *args: served.append(args))
    args = ["disagg-proxy", "--prefill", P1, "--prefill", P2, "--decode", D1, "--port", "9000"]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0
    assert served == [((P1, P2), (D1,), "127.0.0.1", 9000)]
