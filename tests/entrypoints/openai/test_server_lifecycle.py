"""Servers of their own: API keys and endpoint plugins, engine death, SIGTERM."""

from __future__ import annotations

import os
import signal
import textwrap
import time

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


def test_killed_engine_core_turns_the_server_unhealthy_within_seconds():
    server = ServerProcess().wait_ready()
    try:
        os.kill(server.engine_pid(), signal.SIGKILL)
        deadline = time.monotonic() + 5
        while httpx.get(f"{server.url}/health").status_code == 200:
            assert time.monotonic() < deadline, "server still healthy 5 s after the kill"
            time.sleep(0.1)
        start = time.monotonic()
        response = httpx.post(f"{server.url}/v1/completions", json=COMPLETION, timeout=30)
        assert response.status_code == 503 and "engine" in response.json()["error"]["message"]
        assert time.monotonic() - start < 5
    finally:
        server.stop()


def test_sigterm_stops_the_server_and_its_engine_core():
    server = ServerProcess().wait_ready()
    engine_pid = server.engine_pid()
    assert server.stop() is not None
    deadline = time.monotonic() + 10
    while pid_alive(engine_pid):
        assert time.monotonic() < deadline, "engine core outlived its server"
        time.sleep(0.1)
