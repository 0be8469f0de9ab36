"""llama.cpp's C++ `llama-server` as a peer (built by `benchmarks.llama_cpp_build`): the same
GGUF, the benchmarks' threads, continuous batching over parallel slots, on 127.0.0.1.

W1, W2 and W3 all go through the server with the shared serve client, so prompts arrive
as the same token ids every engine sees.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from benchmarks import llama_cpp_build
from benchmarks.workloads import (
    Metrics,
    Prompts,
    free_port,
    serve_load,
    server_process,
    single_stream_metrics,
    thread_env,
)

# Context for all slots together: each of 32 slots gets 512 tokens, enough for W1's
# 256-token prompts plus 128 outputs. Batch sizes and --cache-ram as PEERS.md ran them.
CONTEXT_LEN = 16384


@dataclass(frozen=True)
class Server:
    url: str
    label: str  # how it runs, for the report's "how" column


def server_command(
    binary: Path, gguf_path: Path, port: int, num_threads: int, num_slots: int
) -> list[str]:
    return [
        str(binary), "-m", str(gguf_path), "--host", "127.0.0.1", "--port", str(port),
        "-t", str(num_threads), "-tb", str(num_threads), "-np", str(num_slots), "-cb",
        "-c", str(CONTEXT_LEN), "-b", "2048", "-ub", "512", "--cache-ram", "0", "--metrics",
    ]  # fmt: skip


@contextmanager
def running_server(gguf_path: Path, num_threads: int, num_slots: int) -> Iterator[Server]:
    """A llama-server for the block's duration."""
    if not llama_cpp_build.is_built():
        raise RuntimeError("llama-server is not built: run `python -m benchmarks.llama_cpp_build`")
    port = free_port()
    binary = llama_cpp_build.bin_dir() / "llama-server"
    command = server_command(binary, gguf_path, port, num_threads, num_slots)
    label = f"llama-server, {num_slots} slots"
    with server_process(command, f"http://127.0.0.1:{port}", thread_env(num_threads)) as url:
        yield Server(url, label)


def version() -> str:
    """`llama-server --version`'s first line without its label, e.g. "1 (abc1234)"."""
    binary = llama_cpp_build.bin_dir() / "llama-server"
    done = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    lines = (done.stdout + done.stderr).strip().splitlines()
    return lines[0].removeprefix("version: ") if lines else "unknown"


def single_stream(server: Server, prompts: Prompts, output_len: int) -> Metrics:
    """W2: one request at a time; the first only warms up (distinct prompts, so the
    slot's cached prompt never matches the next one)."""
    serve_load(server.url, prompts[:1], output_len, 1)
    result = serve_load(server.url, prompts[1:], output_len, 1)
    metrics = single_stream_metrics(result.ttft_ms.median, result.tpot_ms.median)
    return {**metrics, "how": f"{server.label}: one request at a time"}


__all__ = ["Server", "running_server", "server_command", "single_stream", "version"]
