"""A client's X-Request-Id never touches another client's request: a duplicate id is refused
(400) while the request in flight under it runs to its end, and ids the server picks cannot
be guessed by a client (a real `core serve`)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

pytestmark = pytest.mark.slow

MAX_TOKENS = 48


async def stream_until_first_token(client: httpx.AsyncClient, headers: dict[str, str]):
    """Start a streamed completion; return (the response, its line iterator) once its first
    token arrived, so the request is surely in flight."""
    body = {"prompt": "Once upon a time", "max_tokens": MAX_TOKENS, "stream": True,
            "ignore_eos": True, "temperature": 0}  # fmt: skip
    request = client.build_request("POST", "/v1/completions", json=body, headers=headers)
    response = await client.send(request, stream=True)
    assert response.status_code == 200
    lines = response.aiter_lines()
    async for line in lines:
        if line.startswith("data: ") and json.loads(line[6:])["choices"][0]["text"]:
            return response, lines
    raise AssertionError("the stream ended before its first token")


async def finish_reason(response: httpx.Response, lines) -> tuple[str, int]:
    """The stream's finish reason and how many more text chunks it sent."""
    reason, chunks = None, 0
    async for line in lines:
        if line.startswith("data: ") and line != "data: [DONE]":
            choice = json.loads(line[6:])["choices"][0]
            chunks += bool(choice["text"])
            reason = choice.get("finish_reason") or reason
    await response.aclose()
    return reason, chunks


async def one_token(client: httpx.AsyncClient, request_id: str) -> httpx.Response:
    body = {"prompt": "Hi", "max_tokens": 1}
    return await client.post("/v1/completions", json=body, headers={"X-Request-Id": request_id})


def test_a_duplicate_request_id_is_refused_and_leaves_the_first_request_running(default_server):
    async def run() -> None:
        async with httpx.AsyncClient(base_url=default_server.url, timeout=60) as client:
            first = await stream_until_first_token(client, {"X-Request-Id": "trace-abc"})
            duplicate = await one_token(client, "trace-abc")
            assert duplicate.status_code == 400
            assert "trace-abc" in duplicate.json()["error"]["message"]
            assert await finish_reason(*first) == ("length", MAX_TOKENS - 1)

    asyncio.run(run())


def test_client_ids_shaped_like_server_ids_reach_no_other_request(default_server):
    """The server names requests sent without X-Request-Id; ids a client could guess for
    them (req-0, req-1, ...) are other requests' names, never theirs."""

    async def run() -> None:
        async with httpx.AsyncClient(base_url=default_server.url, timeout=60) as client:
            first = await stream_until_first_token(client, {})
            guesses = [f"req-{i}" for i in range(64)]
            answers = await asyncio.gather(*(one_token(client, g) for g in guesses))
            assert [a.status_code for a in answers] == [200] * len(guesses)
            assert await finish_reason(*first) == ("length", MAX_TOKENS - 1)

    asyncio.run(run())
