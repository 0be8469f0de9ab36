"""/health reports an engine core that is alive but frozen: a real `core serve` whose engine
core is stopped (SIGSTOP) answers 503 while it is, and 200 again once it runs."""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest
from server_process import ServerProcess

pytestmark = pytest.mark.slow

TIMEOUT_S = 2.0  # CORE_ENGINE_HEARTBEAT_TIMEOUT_S for this server (default 10)


def wait_for_status(url: str, status: int, within_s: float) -> httpx.Response:
    deadline = time.monotonic() + within_s
    while True:
        response = httpx.get(f"{url}/health", timeout=5)
        if response.status_code == status or time.monotonic() > deadline:
            return response
        time.sleep(0.2)


def test_a_stopped_engine_core_is_a_503_until_it_runs_again():
    server = ServerProcess(env={"CORE_ENGINE_HEARTBEAT_TIMEOUT_S": str(TIMEOUT_S)}).wait_ready()
    try:
        engine = server.engine_pid()
        time.sleep(2 * TIMEOUT_S)  # idle for longer than the timeout: heartbeats keep it healthy
        assert httpx.get(f"{server.url}/health").status_code == 200
        os.kill(engine, signal.SIGSTOP)
        try:
            stopped = wait_for_status(server.url, 503, within_s=4 * TIMEOUT_S)
        finally:
            os.kill(engine, signal.SIGCONT)
        assert stopped.status_code == 503
        error = stopped.json()["error"]
        assert error["code"] == "engine_unresponsive" and "last heard from" in error["message"]
        assert wait_for_status(server.url, 200, within_s=4 * TIMEOUT_S).status_code == 200
        body = {"prompt": "Hello", "max_tokens": 2}
        assert httpx.post(f"{server.url}/v1/completions", json=body, timeout=30).is_success
    finally:
        server.stop()
