"""vLLM's optional server features, on a real `core serve`: --enable-force-include-usage
sends the usage chunk to every stream, --enable-prompt-tokens-details counts the prompt
tokens the prefix cache served, --enable-tokenizer-info-endpoint serves /tokenizer_info,
--enable-server-load-tracking counts the requests in /load; and one choice per streamed
chunk."""

from __future__ import annotations

import json

import httpx
import pytest
from server_process import ServerProcess

pytestmark = pytest.mark.slow

# 40+ tokens: at least two full KV blocks of 16, which a second request finds cached.
LONG = "The quick brown fox jumps over the lazy dog while the cat watches. " * 3


@pytest.fixture(scope="module")
def server():
    flags = (
        "--enable-force-include-usage",
        "--enable-prompt-tokens-details",
        "--enable-tokenizer-info-endpoint",
        "--enable-server-load-tracking",
    )
    server = ServerProcess(*flags).wait_ready()
    yield server
    server.stop()


def chunks(url: str, body: dict) -> list[dict]:
    with httpx.stream("POST", url, json=body, timeout=60) as response:
        assert response.status_code == 200
        lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_every_stream_ends_with_the_usage_chunk_unasked(server):
    body = {"prompt": "Hello", "max_tokens": 3, "stream": True, "ignore_eos": True}
    streamed = chunks(f"{server.url}/v1/completions", body)
    *_, last = streamed
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 3
    assert all("usage" not in chunk or chunk["usage"] is None for chunk in streamed[:-1])


def test_cached_prompt_tokens_are_reported(server):
    body = {"prompt": LONG, "max_tokens": 1}
    first = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).json()["usage"]
    again = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).json()["usage"]
    assert first["prompt_tokens_details"] == {"cached_tokens": 0}
    cached = again["prompt_tokens_details"]["cached_tokens"]
    assert 32 <= cached < again["prompt_tokens"]


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_a_stream_of_n_samples_sends_one_choice_a_chunk(default_server, route):
    body = {"max_tokens": 4, "n": 3, "stream": True, "temperature": 1.0, "seed": 7}
    if route == "/v1/completions":
        body["prompt"] = "Once upon a time"
    else:
        body["messages"] = [{"role": "user", "content": "Tell me a story"}]
    streamed = chunks(f"{default_server.url}{route}", body)
    assert all(len(chunk["choices"]) == 1 for chunk in streamed)
    assert {chunk["choices"][0]["index"] for chunk in streamed} == {0, 1, 2}


def test_tokenizer_info_is_served_only_when_enabled(server, default_server):
    info = httpx.get(f"{server.url}/tokenizer_info").json()
    assert info["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert info["eos_token"] == "<|im_end|>"  # SmolLM2-Instruct's end of turn
    assert "{% for message in messages %}" in info["chat_template"]
    assert info["model_max_length"] == 1024  # server_process.SMALL's --max-model-len
    assert httpx.get(f"{default_server.url}/tokenizer_info").status_code == 404


def test_load_counts_the_requests_being_served(server, default_server):
    body = {"prompt": "Once", "max_tokens": 64, "stream": True, "ignore_eos": True}
    for url, counting in ((server.url, True), (default_server.url, False)):
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
            lines = response.iter_lines()  # kept: a dropped iterator closes the stream
            next(lines)  # the stream has started
            during = httpx.get(f"{url}/load").json()["server_load"]
        assert during == (1 if counting else 0)
    assert httpx.get(f"{server.url}/load").json() == {"server_load": 0}
