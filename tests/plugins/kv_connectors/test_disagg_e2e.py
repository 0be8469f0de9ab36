"""Prefill/decode disaggregation end to end, three processes on localhost and the default
model: a prefill `core serve` (p2p producer), a decode `core serve` (p2p consumer) and
`core disagg-proxy` in front. The proxy's greedy answers equal one engine's, and the
decode engine's metrics show it read every prompt token but the last."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import httpx
import openai
import pytest
from server_process import ServerProcess, free_port

pytestmark = pytest.mark.slow

PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea:",
    "List three prime numbers greater than ten, separated by commas:",
    "def fibonacci(n):",
]


def p2p(role: str, port: int | None = None) -> str:
    extra = "" if port is None else f', "kv_connector_extra_config": {{"kv_port": {port}}}'
    return f'{{"kv_connector": "p2p", "kv_role": "{role}"{extra}}}'


@pytest.fixture(scope="module")
def fleet():
    kv_port = free_port()
    prefill = ServerProcess("--kv-transfer-config", p2p("kv_producer", kv_port))
    decode = ServerProcess("--kv-transfer-config", p2p("kv_consumer"))
    proxy_port = free_port()
    proxy = subprocess.Popen(
        [sys.executable, "-c", "from core.entrypoints.cli import main; main()", "disagg-proxy",
         "--prefill", prefill.url, "--decode", decode.url, "--port", str(proxy_port)],
        env=dict(os.environ),
    )  # fmt: skip
    try:
        prefill.wait_ready(), decode.wait_ready()
        proxy_url = f"http://127.0.0.1:{proxy_port}"
        _wait_healthy(proxy_url)
        yield prefill, decode, proxy_url
    finally:
        proxy.terminate()
        proxy.wait(30)
        prefill.stop(), decode.stop()


def _wait_healthy(url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"{url} not healthy")


def complete(url: str, prompt: str) -> openai.types.Completion:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none")
    return client.completions.create(model=client.models.list().data[0].id, prompt=prompt,
                                     max_tokens=12, temperature=0)  # fmt: skip


def test_the_proxy_answers_as_one_engine_and_the_decode_engine_reads_the_prompts(fleet):
    prefill, decode, proxy_url = fleet
    alone = [complete(prefill.url, p).choices[0].text for p in PROMPTS]
    through = [complete(proxy_url, p) for p in PROMPTS]
    assert [c.choices[0].text for c in through] == alone
    metrics = httpx.get(f"{decode.url}/metrics").text
    # Every prompt token but the last came from the prefill engine...
    read = sum(c.usage.prompt_tokens - 1 for c in through)
    assert metric(metrics, "external_prefix_cache_hits_total") == read
    # ... and its steps counted (vLLM's iteration_tokens: uncached prompt tokens plus
    # generated ones) one prompt token and 12 outputs per request: no prompt recomputed.
    assert metric(metrics, "iteration_tokens_total_sum") == (1 + 12) * len(PROMPTS)


def metric(text: str, name: str) -> float:
    (value,) = re.findall(rf"^vllm:{name}\{{[^}}]*\}} (\S+)$", text, re.M)
    return float(value)
