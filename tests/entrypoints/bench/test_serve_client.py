"""The load generator against scripted in-process servers: counts, timings, failures."""

from __future__ import annotations

import asyncio
import itertools
import math
import socket

import pytest
from fastapi.responses import PlainTextResponse, StreamingResponse

from core.entrypoints.bench.serve_client import (
    _arrival_times,
    benchmark_serving,
    fake_openai_app,
    measure_client_overhead,
    running_server,
)

INTERVAL_S = 0.04
# The server sleeps INTERVAL_S between chunks, but a chunk the client reads late shortens
# the next gap it sees by as much (0.3 ms in one CI run): gaps may fall this far below.
JITTER_MS = 5.0
PACED_MS = INTERVAL_S * 1000 - JITTER_MS
PROMPTS = [[7, i + 1, 3, 4, 5] for i in range(6)]


def bench(url: str, prompts=PROMPTS, output_len=8, **kwargs):
    return asyncio.run(benchmark_serving(url, "fake", prompts, output_len, **kwargs))


@pytest.fixture(scope="module")
def paced_url():
    with running_server(fake_openai_app(token_interval_s=INTERVAL_S)) as url:
        yield url


def test_counts_and_tokens_of_a_clean_run(paced_url):
    result = bench(paced_url, max_concurrency=3)
    assert (result.num_requests, result.num_failed, result.errors) == (6, 0, {})
    assert (result.prompt_tokens, result.output_tokens) == (30, 48)
    assert result.output_throughput == pytest.approx(48 / result.duration_s)
    assert result.request_throughput == pytest.approx(6 / result.duration_s)


def test_itl_and_tpot_follow_the_servers_pace_and_ttft_does_not(paced_url):
    result = bench(paced_url, max_concurrency=3)
    for figure in (result.itl_ms, result.tpot_ms):
        assert PACED_MS <= figure.median < INTERVAL_S * 1000 * 2
    assert result.ttft_ms.median < INTERVAL_S * 1000  # the first chunk is sent at once
    assert result.e2e_ms.median >= 7 * INTERVAL_S * 1000


def test_per_request_output_lengths(paced_url):
    result = bench(paced_url, prompts=PROMPTS[:3], output_len=[1, 2, 3])
    assert result.output_tokens == 6
    assert result.itl_ms.median >= PACED_MS  # gaps only from the 2- and 3-token ones


class InFlight:
    """ASGI wrapper recording the most requests the server ever held at once."""

    def __init__(self, app) -> None:
        self.app, self.now, self.most = app, 0, 0

    async def __call__(self, scope, receive, send) -> None:
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            await self.app(scope, receive, send)
        finally:
            self.now -= 1


@pytest.mark.parametrize("max_concurrency, expected", [(2, 2), (None, 6)])
def test_max_concurrency_bounds_requests_in_flight(max_concurrency, expected):
    app = InFlight(fake_openai_app(token_interval_s=INTERVAL_S))
    with running_server(app) as url:
        bench(url, max_concurrency=max_concurrency)
    assert app.most == expected


def test_request_rate_spreads_arrivals_as_a_seeded_poisson_process():
    arrivals = _arrival_times(2000, 50.0, seed=1)
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]
    assert arrivals[0] == 0.0 and min(gaps) >= 0.0
    assert sum(gaps) / len(gaps) == pytest.approx(1 / 50, rel=0.1)
    assert _arrival_times(2000, 50.0, seed=1) == arrivals != _arrival_times(2000, 50.0, seed=2)
    assert _arrival_times(3, math.inf, seed=1) == [0.0, 0.0, 0.0]


def test_a_finite_rate_paces_the_run(paced_url):
    # 6 requests at 20/s: the last arrives about 0.25 s in, then streams 7 gaps
    result = bench(paced_url, request_rate=20.0, seed=0)
    assert result.duration_s >= _arrival_times(6, 20.0, seed=0)[-1] + 7 * INTERVAL_S


def test_tokens_sharing_a_chunk_count_as_zero_gaps():
    with running_server(fake_openai_app(token_interval_s=INTERVAL_S, tokens_per_chunk=4)) as url:
        result = bench(url)
    # 8 tokens in 2 chunks: one real gap and 6 zero gaps per request
    assert result.output_tokens == 48
    assert result.itl_ms.median == 0.0
    # A request's gaps add up to its tokens' span, which the stream's end only extends
    # (more so on a busy machine): never above TPOT. Dropping the zero gaps instead would
    # leave one real gap per request and a mean about 7 times larger.
    assert 0.3 * result.tpot_ms.mean <= result.itl_ms.mean <= result.tpot_ms.mean * (1 + 1e-9)


def test_without_usage_tokens_are_counted_from_chunks(paced_url):
    result = bench(paced_url, extra_body={"stream_options": {"include_usage": False}})
    assert (result.output_tokens, result.prompt_tokens) == (48, 30)
    text = bench(paced_url, prompts=["a b", "c"], extra_body={"stream_options": None})
    assert (text.output_tokens, text.prompt_tokens) == (16, 0)


def test_chat_endpoint_reads_deltas_and_wants_text(paced_url):
    result = bench(paced_url, prompts=["hello", "there"], endpoint="/v1/chat/completions")
    assert (result.num_failed, result.output_tokens) == (0, 16)
    with pytest.raises(ValueError, match="chat endpoint takes text"):
        bench(paced_url, endpoint="/v1/chat/completions")


def failing_every_third(app):
    count = itertools.count()

    async def wrapped(scope, receive, send) -> None:
        if next(count) % 3 == 0:
            await PlainTextResponse("boom", status_code=500)(scope, receive, send)
        else:
            await app(scope, receive, send)

    return wrapped


def test_http_errors_are_counted_and_the_rest_reported():
    with running_server(failing_every_third(fake_openai_app())) as url:
        result = bench(url, max_concurrency=1)
    assert (result.num_requests, result.num_failed) == (6, 2)
    assert result.errors == {"HTTP 500: boom": 2}
    assert result.output_tokens == 4 * 8
    assert result.request_throughput == pytest.approx(4 / result.duration_s)


async def error_mid_stream(scope, receive, send) -> None:
    async def body():
        yield 'data: {"choices": [{"index": 0, "text": "a"}]}\n\n'
        yield 'data: {"error": {"message": "engine died", "code": 503}}\n\n'
        yield "data: [DONE]\n\n"

    await StreamingResponse(body(), media_type="text/event-stream")(scope, receive, send)


def test_an_error_chunk_fails_the_request():
    with running_server(error_mid_stream) as url:
        result = bench(url, prompts=PROMPTS[:2])
    assert result.num_failed == 2
    assert result.errors == {'error in stream: {"message": "engine died", "code": 503}': 2}
    assert math.isnan(result.ttft_ms.median) and result.output_tokens == 0


def test_an_unreachable_server_fails_every_request_without_raising():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again before the run: nobody listens
    result = bench(f"http://127.0.0.1:{port}", prompts=PROMPTS[:2])
    assert result.num_failed == 2
    assert all(message.startswith("ConnectError") for message in result.errors)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"prompts": []}, "prompts must not be empty"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"request_rate": 0.0}, "request_rate"),
        ({"output_len": [8, 8]}, "2 entries for 6 prompts"),
    ],
)
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        bench("http://127.0.0.1:9", **kwargs)


def test_client_overhead_is_a_small_cpu_cost_per_token():
    overhead_ms = asyncio.run(
        measure_client_overhead(num_requests=8, output_len=32, max_concurrency=8)
    )
    # Python's client costs tens of microseconds a token; 2 ms would be a slow server.
    assert 0.0 < overhead_ms < 2.0
