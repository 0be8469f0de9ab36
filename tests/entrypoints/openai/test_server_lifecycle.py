"""Servers of their own: API keys and endpoint plugins, engine death, SIGTERM and SIGINT.

Each server that is stopped or loses its engine gets its own TMPDIR, where the engine
core's IPC directory lives, so the test can see that none is left behind."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import textwrap
import time
from pathlib import Path

import httpx
import pytest
from server_process import ServerProcess, pid_alive

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
COMPLETION = {"model": MODEL, "prompt": "Hello", "max_tokens": 2}


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory):
    """A throw-away distribution with a `core.endpoints` entry point."""
    root = tmp_path_factory.mktemp("site")
    (root / "acme_routes").mkdir()
    (root / "acme_routes" / "__init__.py").write_text(
        textwrap.dedent("""
        from fastapi import APIRouter

        CORE_PLUGIN_API = ">=1.0,<2"

        def router():
            r = APIRouter()

            @r.get("/acme")
            def acme():
                return {"acme": True}

            return r
    """)
    )
    info = root / "acme_routes-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-routes\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[core.endpoints]\nacme = acme_routes:router\n")
    return str(root)


def test_api_key_and_allowlisted_endpoint_plugin(plugin_site):
    pythonpath = os.pathsep.join([plugin_site, os.environ.get("PYTHONPATH", "")])
    server = ServerProcess(
        "--api-key", "sesame", env={"PYTHONPATH": pythonpath, "CORE_PLUGINS": "acme-routes"}
    )
    try:
        server.wait_ready()
        url = f"{server.url}/v1/completions"
        missing = httpx.post(url, json=COMPLETION, timeout=30)
        wrong = httpx.post(url, json=COMPLETION, headers={"Authorization": "Bearer nope"})
        right = httpx.post(
            url, json=COMPLETION, headers={"Authorization": "Bearer sesame"}, timeout=30
        )
        assert (missing.status_code, wrong.status_code, right.status_code) == (401, 401, 200)
        assert missing.json()["error"]["type"] == "authentication_error"
        auth = {"Authorization": "Bearer sesame"}
        assert httpx.get(f"{server.url}/acme", headers=auth).json() == {"acme": True}
    finally:
        server.stop()


def test_endpoint_plugin_is_not_mounted_unless_allowlisted(plugin_site):
    pythonpath = os.pathsep.join([plugin_site, os.environ.get("PYTHONPATH", "")])
    server = ServerProcess(env={"PYTHONPATH": pythonpath})
    try:
        server.wait_ready()
        response = httpx.get(f"{server.url}/acme")
        assert response.status_code == 404 and "error" in response.json()
    finally:
        server.stop()


def test_killed_engine_core_fails_its_stream_then_the_server_exits_1(tmp_path):
    server = ServerProcess(env={"TMPDIR": str(tmp_path)}).wait_ready()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            events = asyncio.run(_streams(server.url, 1, kill=server.engine_pid()))[0]
            assert events[-1] == "[DONE]"
            error = events[-2]["error"]
            assert (error["code"], error["type"]) == ("engine_dead", "server_error")
            assert server.wait_exit(10) == 1
            with pytest.raises(httpx.ConnectError):
                client.get("/health")
        assert not list(tmp_path.glob("core-ipc-*"))
    finally:
        server.stop()


def test_with_keep_alive_a_dead_engine_answers_503_and_no_running_requests():
    server = ServerProcess(env={"CORE_KEEP_ALIVE_ON_ENGINE_DEATH": "1"}).wait_ready()
    try:
        events = asyncio.run(_streams(server.url, 1, kill=server.engine_pid()))[0]
        assert events[-2]["error"]["code"] == "engine_dead"
        with httpx.Client(base_url=server.url, timeout=30) as client:
            assert client.get("/health").status_code == 503
            for body in (COMPLETION, {**COMPLETION, "stream": True}):
                response = client.post("/v1/completions", json=body)
                assert response.status_code == 503, body
                assert response.json()["error"]["code"] == "engine_dead"
            time.sleep(2)  # a server that would exit has done so by now
            assert server.proc.poll() is None and client.get("/health").status_code == 503
            assert _gauges(client.get("/metrics").text) == {
                "vllm:num_requests_running": 0.0,
                "vllm:num_requests_waiting": 0.0,
            }
        assert server.stop() == 0
    finally:
        server.stop()


def test_sigterm_on_an_idle_server_exits_0_and_leaves_nothing(tmp_path):
    server = ServerProcess(env={"TMPDIR": str(tmp_path)}).wait_ready()
    engine_pid = server.engine_pid()
    start = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    assert server.wait_exit(10) == 0
    assert time.monotonic() - start < 5
    assert not pid_alive(engine_pid)
    assert not list(tmp_path.glob("core-ipc-*"))


def test_sigterm_while_the_engine_core_starts_exits_0_and_leaves_nothing(tmp_path):
    server = ServerProcess(env={"TMPDIR": str(tmp_path)})
    try:
        engine_pid = _engine_core_once_spawned(server)
        assert list(tmp_path.glob("core-ipc-*"))  # its sockets are there while it starts
        server.proc.send_signal(signal.SIGTERM)
        assert server.wait_exit(15) == 0
        assert not pid_alive(engine_pid)
        assert not list(tmp_path.glob("core-ipc-*"))
    finally:
        server.stop()


def _engine_core_once_spawned(server: ServerProcess) -> int:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert server.proc.poll() is None, server.log.read_text()[-3000:]
        children = Path(f"/proc/{server.proc.pid}/task/{server.proc.pid}/children").read_text()
        if children.split():
            return server.engine_pid()
        time.sleep(0.05)
    raise TimeoutError("no engine core after 120 s")


SHUTDOWN_TIMEOUT = 3
NUM_STREAMS = 16


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_drains_then_aborts_open_streams_and_exits_0(tmp_path, signum):
    server = ServerProcess(
        "--shutdown-timeout", str(SHUTDOWN_TIMEOUT), env={"TMPDIR": str(tmp_path)}
    ).wait_ready()
    try:
        engine_pid = server.engine_pid()
        signalled: list[float] = []

        def stop() -> None:
            signalled.append(time.monotonic())
            server.proc.send_signal(signum)

        streams = asyncio.run(_streams(server.url, NUM_STREAMS, stop=stop))
        assert server.wait_exit(SHUTDOWN_TIMEOUT + 5) == 0
        assert time.monotonic() - signalled[0] < SHUTDOWN_TIMEOUT + 2
        for events in streams:  # a final chunk says why, then [DONE], then a clean close
            assert events[-1] == "[DONE]"
            assert events[-2]["choices"][0]["finish_reason"] == "abort"
        assert not pid_alive(engine_pid)
        assert not list(tmp_path.glob("core-ipc-*"))
    finally:
        server.stop()


async def _streams(url: str, n: int, stop=None, kill: int | None = None) -> list[list]:
    """Open `n` streams that cannot finish soon; once each has its first chunk, call `stop`
    or SIGKILL the process `kill`; every stream's events (JSON, then "[DONE]") to its end.
    A connection cut mid-stream raises (httpx's RemoteProtocolError)."""
    body = {**COMPLETION, "max_tokens": 900, "ignore_eos": True, "stream": True}
    started = asyncio.Barrier(n + 1)

    async def stream(client: httpx.AsyncClient) -> list:
        events: list = []
        async with client.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    data = line.removeprefix("data: ")
                    events.append(data if data == "[DONE]" else json.loads(data))
                    if len(events) == 1:
                        await started.wait()
        return events

    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        tasks = [asyncio.create_task(stream(client)) for _ in range(n)]
        await asyncio.wait_for(started.wait(), 60)
        if stop is not None:
            stop()
        if kill is not None:
            os.kill(kill, signal.SIGKILL)
        return await asyncio.gather(*tasks)


def _gauges(metrics_text: str) -> dict[str, float]:
    """The running and waiting request gauges (one engine)."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = ("vllm:num_requests_running", "vllm:num_requests_waiting")
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(metrics_text)
        for sample in family.samples
        if sample.name in wanted
    }
