"""vLLM's sleep routes on a real `core serve --enable-sleep-mode`: POST /sleep?level=N
frees at least the weights' size of the engine-core process's RSS (its worker holds the
weights), GET /is_sleeping says so, a completion sent meanwhile waits and, once POST
/wake_up is answered, is answered as before; bad levels and tags are 400s. Without the flag
the routes are refused and the engine serves on."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest
from server_process import ServerProcess
from tiny_engine_checkpoint import write_tiny_checkpoint

from core.testing.tiny_checkpoint import VOCAB, random_llama

pytestmark = pytest.mark.slow

COMPLETION = {"prompt": "w1 w2 w3", "max_tokens": 8, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A random llama of about 50 MB of float32 weights, served with sleep mode; and that
    size in bytes."""
    model = random_llama(
        VOCAB, hidden_size=256, intermediate_size=8192, num_heads=4, num_kv_heads=1,
        num_layers=2, max_positions=64, seed=0,
    )  # fmt: skip
    weights_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    checkpoint = write_tiny_checkpoint(tmp_path_factory.mktemp("fifty"), model)
    process = ServerProcess(
        str(checkpoint), "--dtype", "float32", "--max-model-len", "64",
        "--kv-cache-memory", "16MiB", "--enable-sleep-mode",
    ).wait_ready()  # fmt: skip
    yield process, weights_bytes
    process.stop()


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def complete(url: str) -> str:
    response = httpx.post(f"{url}/v1/completions", json=COMPLETION, timeout=120)
    response.raise_for_status()
    return response.json()["choices"][0]["text"]


@pytest.mark.parametrize("level", [1, 2])
def test_sleep_frees_the_weights_and_a_request_sent_asleep_is_answered_after_waking(server, level):
    process, weights_bytes = server
    url, pid = process.url, process.engine_pid()
    before = complete(url)
    awake = rss_bytes(pid)
    assert httpx.post(f"{url}/sleep", params={"level": level}, timeout=60).status_code == 200
    assert httpx.get(f"{url}/is_sleeping").json() == {"is_sleeping": True}
    assert awake - rss_bytes(pid) >= weights_bytes
    answered: list[str] = []
    waiting = threading.Thread(target=lambda: answered.append(complete(url)))
    waiting.start()
    time.sleep(1.0)
    assert not answered  # it waits for the engine to wake
    assert httpx.post(f"{url}/wake_up", timeout=60).status_code == 200
    waiting.join(60)
    assert answered == [before]
    assert httpx.get(f"{url}/is_sleeping").json() == {"is_sleeping": False}
    assert complete(url) == before


@pytest.mark.parametrize(
    ("route", "params", "named"),
    [("sleep", {"level": 3}, "level"), ("wake_up", {"tags": "bogus"}, "tags")],
)
def test_a_bad_level_or_tag_is_a_400_and_the_engine_serves_on(server, route, params, named):
    process, _ = server
    response = httpx.post(f"{process.url}/{route}", params=params)
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith(named)
    assert httpx.get(f"{process.url}/is_sleeping").json() == {"is_sleeping": False}
    assert complete(process.url)


def test_without_the_flag_the_routes_are_refused(default_server):
    url = default_server.url
    for route in ("sleep", "wake_up"):
        response = httpx.post(f"{url}/{route}")
        assert response.status_code == 400
        assert response.json()["error"]["message"].startswith("enable_sleep_mode")
    assert httpx.get(f"{url}/is_sleeping").json() == {"is_sleeping": False}
    assert httpx.get(f"{url}/health").status_code == 200
