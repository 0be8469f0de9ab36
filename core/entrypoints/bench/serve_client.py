"""An asyncio load generator for any OpenAI-compatible server (ours, llama.cpp's, vLLM's).

Every request streams (`stream: true` with usage), so each chunk is timestamped as it
arrives. Definitions, per successful request:

- TTFT: from sending the request to the first chunk carrying text.
- ITL: the gaps between consecutive chunks carrying text. When the server's usage counts
  N output tokens but only C < N chunks carried text (a chunk held several tokens, e.g. a
  detokenizer holding back an incomplete character), N - C zero gaps are added, as if each
  k-token chunk were k tokens arriving together. So every request contributes N - 1 gaps,
  their sum is last chunk - first chunk, and mean ITL matches TPOT for a single request.
- TPOT: (e2e - TTFT) / (N - 1), for requests with N > 1.
- E2E: from sending the request to the end of the stream.

Output tokens come from the final usage chunk, or by counting text chunks when the server
sends no usage. A request fails on a non-200 status, a transport error, an undecodable or
`error` chunk, or a stream with no tokens; failures are counted by message, never raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import msgspec
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from core.entrypoints.bench.results import Percentiles, ServeResult
from core.entrypoints.bench.throughput import output_lens_for


class _Delta(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    text: str | None = None  # /v1/completions
    delta: _Delta | None = None  # /v1/chat/completions

    def has_text(self) -> bool:
        return bool(self.text or (self.delta is not None and self.delta.content))


class _Usage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class _Chunk(msgspec.Struct):
    """Only the fields the client reads: typed decoding skips building a dict per chunk."""

    choices: list[_Choice] = msgspec.field(default_factory=list)
    usage: _Usage | None = None
    error: Any = None


_decode_chunk = msgspec.json.Decoder(_Chunk).decode


@dataclass
class _Outcome:
    """One request: times in seconds; `error` is None when it succeeded."""

    error: str | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft_s: float = 0.0
    e2e_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)


async def benchmark_serving(
    base_url: str,
    model: str,
    prompts: list[list[int]] | list[str],
    output_len: int | list[int],
    *,
    max_concurrency: int | None = None,
    request_rate: float = float("inf"),
    seed: int = 0,
    ignore_eos: bool = True,
    endpoint: str = "/v1/completions",
    extra_body: dict | None = None,
) -> ServeResult:
    """Send every prompt to `base_url + endpoint` and report throughput and latencies.

    Requests arrive as a Poisson process of `request_rate` per second (seeded by `seed`;
    all at once when infinite); at most `max_concurrency` are in flight (unlimited when
    None), a request waiting for a slot before its clock starts. Requests are greedy
    (temperature 0), ask `max_tokens = output_len` and send `ignore_eos`; `extra_body`
    keys override any of these. A chat endpoint takes text prompts only. Prompt tokens are
    the server's usage counts, else the length of token prompts (text prompts count 0).
    `num_requests` counts every request sent, failed ones included.
    """
    if not prompts:
        raise ValueError("prompts must not be empty")
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
    if not request_rate > 0:
        raise ValueError(f"request_rate must be > 0, got {request_rate}")
    chat = endpoint.rstrip("/").endswith("chat/completions")
    lens = output_lens_for(prompts, output_len)
    bodies = [
        _request_body(model, prompt, n, ignore_eos, chat, extra_body)
        for prompt, n in zip(prompts, lens, strict=True)
    ]
    arrivals = _arrival_times(len(prompts), request_rate, seed)
    slots = max_concurrency or len(prompts)
    url = base_url.rstrip("/") + endpoint
    # Reads wait as long as the server needs (a queued request's first token may take
    # minutes); only connecting is bounded. The pool is sized so no request waits for it.
    limits = httpx.Limits(max_connections=slots, max_keepalive_connections=slots)
    timeout = httpx.Timeout(None, connect=30.0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        semaphore = asyncio.Semaphore(slots)
        start = time.perf_counter()

        async def launch(index: int) -> _Outcome:
            await asyncio.sleep(max(0.0, start + arrivals[index] - time.perf_counter()))
            async with semaphore:
                return await _send(client, url, bodies[index], prompts[index])

        outcomes = await asyncio.gather(*(launch(i) for i in range(len(prompts))))
        duration = time.perf_counter() - start
    return _summarize(outcomes, duration)


def _request_body(
    model: str,
    prompt: list[int] | str,
    max_tokens: int,
    ignore_eos: bool,
    chat: bool,
    extra_body: dict | None,
) -> bytes:
    body: dict[str, Any] = {"model": model}
    if chat:
        if not isinstance(prompt, str):
            raise ValueError("a chat endpoint takes text prompts, not token ids")
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    body.update(
        max_tokens=max_tokens,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
        ignore_eos=ignore_eos,
    )
    return msgspec.json.encode({**body, **(extra_body or {})})  # encoded before the clock starts


def _arrival_times(num: int, request_rate: float, seed: int) -> list[float]:
    """Seconds after the start: 0 for the first, then exponential gaps (Poisson process)."""
    if math.isinf(request_rate):
        return [0.0] * num
    rng = random.Random(seed)
    times, now = [], 0.0
    for _ in range(num):
        times.append(now)
        now += rng.expovariate(request_rate)
    return times


async def _send(
    client: httpx.AsyncClient, url: str, body: bytes, prompt: list[int] | str
) -> _Outcome:
    start = time.perf_counter()
    chunk_times: list[float] = []
    usage: _Usage | None = None
    headers = {"Content-Type": "application/json"}
    try:
        async with client.stream("POST", url, content=body, headers=headers) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                return _Outcome(error=f"HTTP {response.status_code}: {text[:200]}")
            async for data in _sse_data(response.aiter_lines()):
                now = time.perf_counter()
                chunk = _decode_chunk(data)
                if chunk.error is not None:
                    return _Outcome(error=f"error in stream: {json.dumps(chunk.error)[:200]}")
                usage = chunk.usage or usage
                if any(choice.has_text() for choice in chunk.choices):
                    chunk_times.append(now)
    except (httpx.HTTPError, msgspec.DecodeError) as exc:
        return _Outcome(error=f"{type(exc).__name__}: {exc}"[:200])
    end = time.perf_counter()
    if not chunk_times:
        return _Outcome(error="no output tokens")
    return _timed_outcome(start, end, chunk_times, usage, prompt)


async def _sse_data(lines: AsyncIterator[str]) -> AsyncIterator[bytes]:
    """The payloads of `data:` lines, up to `[DONE]`."""
    async for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        yield data.encode()


def _timed_outcome(
    start: float, end: float, chunk_times: list[float], usage: _Usage | None, prompt: Any
) -> _Outcome:
    num_chunks = len(chunk_times)
    output_tokens = usage.completion_tokens if usage is not None else num_chunks
    if usage is not None:
        prompt_tokens = usage.prompt_tokens
    else:
        prompt_tokens = len(prompt) if isinstance(prompt, list) else 0
    gaps = [b - a for a, b in zip(chunk_times, chunk_times[1:], strict=False)]
    gaps += [0.0] * max(0, output_tokens - num_chunks)  # tokens that shared a chunk
    return _Outcome(
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        ttft_s=chunk_times[0] - start,
        e2e_s=end - start,
        itl_s=gaps,
    )


def _summarize(outcomes: list[_Outcome], duration: float) -> ServeResult:
    done = [o for o in outcomes if o.error is None]
    errors = Counter(o.error for o in outcomes if o.error is not None)
    prompt_tokens = sum(o.prompt_tokens for o in done)
    output_tokens = sum(o.output_tokens for o in done)
    tpots = [(o.e2e_s - o.ttft_s) / (o.output_tokens - 1) for o in done if o.output_tokens > 1]
    return ServeResult(
        num_requests=len(outcomes),
        num_failed=len(outcomes) - len(done),
        duration_s=duration,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        request_throughput=len(done) / duration,
        output_throughput=output_tokens / duration,
        total_token_throughput=(prompt_tokens + output_tokens) / duration,
        ttft_ms=Percentiles.of([o.ttft_s * 1000.0 for o in done]),
        itl_ms=Percentiles.of([gap * 1000.0 for o in done for gap in o.itl_s]),
        tpot_ms=Percentiles.of([t * 1000.0 for t in tpots]),
        e2e_ms=Percentiles.of([o.e2e_s * 1000.0 for o in done]),
        errors=dict(errors),
    )


# -- a server that answers instantly, to measure the client itself ------------------------


def fake_openai_app(token_interval_s: float = 0.0, tokens_per_chunk: int = 1) -> FastAPI:
    """A FastAPI app streaming /v1/completions and /v1/chat/completions with no model.

    Each request gets `max_tokens` tokens (the text " tok" each), `tokens_per_chunk` per
    chunk, chunks `token_interval_s` apart, then a usage chunk at once when
    `stream_options.include_usage` asks for one. Prompt tokens: a token prompt's length,
    else 1.
    """
    app = FastAPI()

    async def stream(request: Request, chat: bool) -> StreamingResponse:
        body = await request.json()
        chunks = _fake_chunks(body, chat, token_interval_s, tokens_per_chunk)
        return StreamingResponse(chunks, media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(request: Request) -> StreamingResponse:
        return await stream(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> StreamingResponse:
        return await stream(request, chat=True)

    return app


async def _fake_chunks(
    body: dict[str, Any], chat: bool, interval_s: float, per_chunk: int
) -> AsyncIterator[str]:
    max_tokens = int(body["max_tokens"])
    for sent in range(0, max_tokens, per_chunk):
        if sent and interval_s:
            await asyncio.sleep(interval_s)
        text = " tok" * min(per_chunk, max_tokens - sent)
        choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
        yield f"data: {json.dumps({'choices': [choice]})}\n\n"
    if (body.get("stream_options") or {}).get("include_usage"):
        prompt = body.get("prompt")
        prompt_tokens = len(prompt) if isinstance(prompt, list) else 1
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": max_tokens}
        yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
    yield "data: [DONE]\n\n"


@contextlib.contextmanager
def running_server(app: Any, timeout_s: float = 30.0) -> Iterator[str]:
    """Serve the ASGI `app` on 127.0.0.1 (a free port) from a background thread.

    Yields the base URL once the server accepts connections; stops it on exit. Its own
    thread and event loop keep its CPU time apart from the caller's.
    """
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + timeout_s
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server on port {port} did not start")
            time.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout_s)
        sock.close()


async def measure_client_overhead(
    num_requests: int = 64, output_len: int = 128, max_concurrency: int = 32
) -> float:
    """The client's CPU time per streamed token, in ms, against an instant server.

    The server runs in its own thread, and only this thread's CPU time is counted
    (`time.thread_time`), so the figure is the client's own cost: sending, reading and
    decoding chunks and the event loop. A server producing T tokens/s keeps the client
    busy for about T * overhead / 1000 of each second.
    """
    prompts = [[index + 1] * 8 for index in range(num_requests)]
    with running_server(fake_openai_app()) as url:
        cpu_start = time.thread_time()
        result = await benchmark_serving(
            url, "fake", prompts, output_len, max_concurrency=max_concurrency
        )
        cpu_s = time.thread_time() - cpu_start
    if result.num_failed:
        raise RuntimeError(f"the instant server failed requests: {result.errors}")
    return cpu_s * 1000.0 / result.output_tokens


__all__ = [
    "benchmark_serving",
    "fake_openai_app",
    "measure_client_overhead",
    "running_server",
]
