"""The event loop keeps answering while requests do slow work: /health answers within
100 ms while a slow chat template renders or a large prompt is tokenized (both off the
loop), a body over --max-request-body-bytes is a 413 before it is parsed, and a request's
own chat_template is refused unless the server trusts request templates.

The app is the real server's (uvicorn over HTTP, the real InputProcessor) over a stand-in
engine that answers every request with one token, so no engine process is started."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn
from server_process import ServerProcess, free_port
from stand_in_engine import StandInEngine
from tiny_engine_checkpoint import MAX_MODEL_LEN, engine_args, write_tiny_checkpoint

from core.config import UsageContext
from core.engine.processor import EngineSetup, InputProcessor
from core.entrypoints.openai.api_server import build_app
from core.entrypoints.openai.frontend_args import FrontendArgs
from core.entrypoints.openai.protocol import TokenizeResponse
from core.entrypoints.openai.routers.tokens import _tokenize_response
from core.outputs import CompletionOutput, RequestOutput

BODY_LIMIT = 3 * 1024 * 1024
# A template that would loop 10^10 times: only the render deadline ends it.
SLOW_TEMPLATE = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


class OneTokenEngine(StandInEngine):
    async def generate(self, request_id, prepared, **_options):
        sample = CompletionOutput(0, "w", [5], None, None, "length")
        yield RequestOutput(
            request_id, prepared.prompt, prepared.prompt_token_ids, None, [sample], finished=True
        )


def serve_in_thread(frontend: FrontendArgs, model_dir) -> Iterator[str]:
    setup = EngineSetup.from_engine_args(engine_args(model_dir), UsageContext.SERVING)
    engine = OneTokenEngine(InputProcessor(setup))
    port = free_port()
    config = uvicorn.Config(
        build_app(engine, frontend=frontend), host="127.0.0.1", port=port, log_level="warning"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def trusting(model_dir) -> Iterator[str]:
    frontend = FrontendArgs(trust_request_chat_template=True, max_request_body_bytes=BODY_LIMIT)
    yield from serve_in_thread(frontend, model_dir)


@pytest.fixture(scope="module")
def default(model_dir) -> Iterator[str]:
    yield from serve_in_thread(FrontendArgs(), model_dir)


class HealthProber:
    """GETs /health in a loop on its own connection and keeps the slowest answer."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.slowest = 0.0
        self.answers = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> HealthProber:
        self._thread.start()
        while self.answers == 0:
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=10) as client:
            while not self._stop.is_set():
                started = time.perf_counter()
                assert client.get("/health").status_code == 200
                self.slowest = max(self.slowest, time.perf_counter() - started)
                self.answers += 1
                time.sleep(0.01)


def test_health_answers_while_a_slow_template_renders(trusting):
    with HealthProber(trusting) as prober:
        started = time.monotonic()
        response = httpx.post(
            f"{trusting}/v1/chat/completions",
            json={**CHAT, "chat_template": SLOW_TEMPLATE},
            timeout=30,
        )
        took = time.monotonic() - started
    assert response.status_code == 400 and response.json()["error"]["param"] == "chat_template"
    assert "did not render within" in response.json()["error"]["message"]
    assert took < 10  # the render deadline (2 s), not the 10^10 iterations
    assert prober.answers > 10 and prober.slowest < 0.1, prober.slowest


def test_health_answers_while_a_large_prompt_is_tokenized(trusting):
    prompt = "w1 w2 w3 " * (2_900_000 // 9)  # under the 3 MiB body limit
    with HealthProber(trusting) as prober:
        response = httpx.post(
            f"{trusting}/v1/completions", json={"prompt": prompt, "max_tokens": 1}, timeout=60
        )
        tokenized = httpx.post(f"{trusting}/tokenize", json={"prompt": prompt}, timeout=60)
    assert response.status_code == 400  # far longer than the context: refused, after tokenizing
    assert response.json()["error"]["param"] == "prompt"
    assert tokenized.status_code == 200 and tokenized.json()["count"] > MAX_MODEL_LEN
    assert prober.slowest < 0.1, prober.slowest


@pytest.mark.parametrize("num_tokens", [0, 1, 2**15, 2**15 + 1, 70_000])
def test_the_tokenize_response_written_in_pieces_is_the_models_json(num_tokens):
    tokens = [(i * 7919) % 50_000 for i in range(num_tokens)]
    response = _tokenize_response(tokens, 4096, None)
    parsed = TokenizeResponse.model_validate_json(response.body)
    assert parsed == TokenizeResponse(tokens=tokens, count=num_tokens, max_model_len=4096)
    assert response.media_type == "application/json"
    strs = [f'w"{i}\\é' for i in tokens]  # quotes, backslashes and non-ASCII survive
    with_strs = TokenizeResponse.model_validate_json(_tokenize_response(tokens, 4096, strs).body)
    assert with_strs == TokenizeResponse(
        tokens=tokens, count=num_tokens, max_model_len=4096, token_strs=strs
    )


def test_a_body_over_the_limit_is_a_413_before_it_is_parsed(trusting):
    body = b'{"prompt": "' + b"w" * BODY_LIMIT + b'"}'
    declared = httpx.post(
        f"{trusting}/v1/completions", content=body, headers={"Content-Type": "application/json"}
    )
    assert declared.status_code == 413
    assert "--max-request-body-bytes" in declared.json()["error"]["message"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit counts what arrives
        for start in range(0, len(body), 65536):
            yield body[start : start + 65536]

    chunked = httpx.post(
        f"{trusting}/v1/completions", content=chunks(), headers={"Content-Type": "application/json"}
    )
    assert chunked.status_code == 413
    assert "--max-request-body-bytes" in chunked.json()["error"]["message"]
    assert httpx.get(f"{trusting}/health").status_code == 200


def test_a_body_under_the_limit_is_served(trusting):
    response = httpx.post(f"{trusting}/v1/completions", json={"prompt": "w1 w2", "max_tokens": 1})
    assert response.status_code == 200 and response.json()["choices"][0]["text"] == "w"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/tokenize"])
def test_a_request_template_is_refused_unless_trusted(default, trusting, path):
    body = {**CHAT, "chat_template": "{{ messages[0].content }}!"}
    refused = httpx.post(f"{default}{path}", json=body)
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "chat_template"
    assert "--trust-request-chat-template" in refused.json()["error"]["message"]
    assert httpx.post(f"{trusting}{path}", json=body).status_code == 200
    assert httpx.post(f"{default}{path}", json=CHAT).status_code == 200


def test_the_default_body_limit_is_two_mebibytes(default):
    just_over = b'{"prompt": "' + b"w" * (2 * 1024 * 1024) + b'"}'
    response = httpx.post(
        f"{default}/v1/completions", content=just_over, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 413


@pytest.mark.slow
def test_core_serve_answers_health_while_it_renders_and_tokenizes():
    """The same on a real `core serve` (SmolLM2's tokenizer, the engine core process)."""
    server = ServerProcess("--trust-request-chat-template").wait_ready()
    try:
        prompt = "hello world, how are you " * (1_900_000 // 25)  # 456k tokens, under 2 MiB
        slow_chat = {**CHAT, "chat_template": SLOW_TEMPLATE}
        with HealthProber(server.url) as prober:
            rendered = httpx.post(f"{server.url}/v1/chat/completions", json=slow_chat, timeout=30)
            tokenized = httpx.post(f"{server.url}/tokenize", json={"prompt": prompt}, timeout=60)
            too_long = httpx.post(
                f"{server.url}/v1/completions", json={"prompt": prompt}, timeout=60
            )
        assert rendered.status_code == 400 and rendered.json()["error"]["param"] == "chat_template"
        assert tokenized.status_code == 200 and tokenized.json()["count"] > 400_000
        assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "prompt"
        assert prober.slowest < 0.1, prober.slowest
    finally:
        server.stop()
