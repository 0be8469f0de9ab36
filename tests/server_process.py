"""A real `core serve` in a subprocess on 127.0.0.1 and a free port, for server tests."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

# Servers a session fixture shares (tests/conftest.py): tests that count the processes they
# leave behind leave these out.
SHARED_SERVER_PIDS: set[int] = set()

SERVE = [sys.executable, "-c", "from core.entrypoints.cli import main; main()", "serve"]
SMALL = ["--max-model-len", "1024", "--kv-cache-memory", "512MiB"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def free_port_pair() -> int:
    """A port p with p + 1 free as well (a data-parallel RPC port binds both)."""
    while True:
        with socket.socket() as first, socket.socket() as second:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            try:
                second.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port


class ServerProcess:
    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = Path(tempfile.mkstemp(prefix="core-serve-", suffix=".log")[1])
        command = [*SERVE, "--host", "127.0.0.1", "--port", str(self.port), *SMALL, *args]
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
            )

    def wait_ready(self, timeout_s: float = 240.0) -> ServerProcess:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"core serve exited:\n{self.log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"core serve not ready:\n{self.log.read_text()[-3000:]}")

    def engine_pid(self) -> int:
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        (pid,) = [int(p) for p in children.split()]
        return pid

    def wait_exit(self, timeout_s: float) -> int:
        """The exit code of a server that ends by itself; TimeoutError (once it is killed)
        when it is still running after `timeout_s`."""
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise TimeoutError(f"core serve still running after {timeout_s} s") from None

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    return state != "Z"


def shared_server_tree() -> set[int]:
    """The pids of the shared servers and of every process under them (engine cores)."""
    import psutil

    tree = set()
    for pid in SHARED_SERVER_PIDS:
        with contextlib.suppress(psutil.NoSuchProcess):
            tree |= {pid, *(p.pid for p in psutil.Process(pid).children(recursive=True))}
    return tree


def completions_at_once(url: str, prompts: list[list[int]], max_tokens: int) -> list[str]:
    """The greedy completion of every prompt (token ids), all sent at once with the openai
    client, ignoring EOS."""
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=120)

    async def complete(prompt: list[int]) -> str:
        out = await client.completions.create(
            model=None, prompt=prompt, max_tokens=max_tokens, temperature=0,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        return out.choices[0].text

    async def all_at_once() -> list[str]:
        async with client:
            return await asyncio.gather(*(complete(p) for p in prompts))

    return asyncio.run(all_at_once())


def engine_series(url: str, name: str) -> dict[str, float]:
    """The value of the metric `name` for each data-parallel engine, from /metrics."""
    text = httpx.get(f"{url}/metrics").text
    return {
        sample.labels["engine"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }
