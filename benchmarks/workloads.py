"""The four workloads of the side-by-side benchmark: their sizes, their prompts, and how
core runs them (W1, W2, W4 through the LLM API; W3 through a real `core serve` process).

Every engine gets the same token ids: prompts are drawn here, once, with fixed seeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

from core.config import CacheConfig
from core.entrypoints.bench.datasets import synthetic_prompts
from core.entrypoints.bench.latency import benchmark_latency
from core.entrypoints.bench.results import LatencyResult, ServeResult
from core.entrypoints.bench.serve_client import benchmark_serving
from core.entrypoints.bench.throughput import benchmark_throughput
from core.entrypoints.llm import LLM
from core.sampling_params import SamplingParams

Prompts = list[list[int]]
Metrics = dict[str, Any]

# Seeds per prompt set; W4 adds W4_SEED_STRIDE * repeat so no repeat reuses a cached prefix.
W1_SEED, W4_SEED, W4_SEED_STRIDE = 0, 100, 10
W2_WARMUP = 1


@dataclass(frozen=True)
class Sizes:
    """How big each workload is; FULL is the issue's definition, QUICK a pipeline check."""

    w1_num_prompts: int
    w1_input_len: tuple[int, int]
    w1_output_len: int
    w2_input_len: int
    w2_output_len: int
    w2_num_iters: int
    w3_max_concurrency: int
    w4_num_prompts: int
    w4_prefix_len: int
    w4_question_len: int
    w4_output_len: int
    w4_num_ttft_probes: int
    w4_repeats: int
    w5_copy_len: int  # tokens of material each W5 prompt asks to repeat
    w5_output_len: int
    w5_num_iters: int  # single-stream prompts timed, after one warm-up
    w5_num_streams: int
    transformers_batch_sizes: tuple[int, ...]
    server_slots: int
    q_num_tokens: int | None  # Q: tokens of the held-out text read (None: all of it)
    q_window: int  # Q: tokens per perplexity window


FULL = Sizes(
    w1_num_prompts=64, w1_input_len=(64, 256), w1_output_len=128,
    w2_input_len=128, w2_output_len=128, w2_num_iters=5,
    w3_max_concurrency=32,
    w4_num_prompts=64, w4_prefix_len=1024, w4_question_len=64, w4_output_len=32,
    w4_num_ttft_probes=8, w4_repeats=2,
    w5_copy_len=256, w5_output_len=256, w5_num_iters=4, w5_num_streams=8,
    transformers_batch_sizes=(16, 64), server_slots=32,
    q_num_tokens=None, q_window=512,
)  # fmt: skip
QUICK = Sizes(
    w1_num_prompts=8, w1_input_len=(16, 64), w1_output_len=16,
    w2_input_len=32, w2_output_len=16, w2_num_iters=2,
    w3_max_concurrency=4,
    w4_num_prompts=8, w4_prefix_len=256, w4_question_len=16, w4_output_len=4,
    w4_num_ttft_probes=2, w4_repeats=2,
    w5_copy_len=32, w5_output_len=16, w5_num_iters=2, w5_num_streams=2,
    transformers_batch_sizes=(4, 8), server_slots=4,
    q_num_tokens=256, q_window=128,
)  # fmt: skip


@dataclass(frozen=True)
class W4Prompts:
    """One repeat of W4: `shared` prompts open with one system prompt; `probes` (the same
    prefix, fresh questions) time TTFT one request at a time, the first only warming the
    cache; `unshared` have the same lengths and no common prefix (the 0%-hit case)."""

    shared: Prompts
    probes: Prompts
    unshared: Prompts


def w1_prompts(tokenizer: Any, sizes: Sizes) -> Prompts:
    return synthetic_prompts(tokenizer, sizes.w1_num_prompts, sizes.w1_input_len, seed=W1_SEED)


def w2_prompts(tokenizer: Any, sizes: Sizes) -> Prompts:
    """A warm-up prompt, then one per iteration: the very prompts core's
    `benchmark_latency` draws (batch 1, the iteration as the seed), all distinct."""
    return [
        synthetic_prompts(tokenizer, 1, sizes.w2_input_len, seed=iteration)[0]
        for iteration in range(W2_WARMUP + sizes.w2_num_iters)
    ]


def w4_prompts(tokenizer: Any, sizes: Sizes, repeat: int) -> W4Prompts:
    seed = W4_SEED + W4_SEED_STRIDE * repeat
    (prefix,) = synthetic_prompts(tokenizer, 1, sizes.w4_prefix_len, seed=seed)
    num_questions = sizes.w4_num_prompts + 1 + sizes.w4_num_ttft_probes
    questions = synthetic_prompts(tokenizer, num_questions, sizes.w4_question_len, seed=seed + 1)
    total_len = sizes.w4_prefix_len + sizes.w4_question_len
    return W4Prompts(
        shared=[prefix + q for q in questions[: sizes.w4_num_prompts]],
        probes=[prefix + q for q in questions[sizes.w4_num_prompts :]],
        unshared=synthetic_prompts(tokenizer, sizes.w4_num_prompts, total_len, seed=seed + 2),
    )


def shared_block_fraction(prompts: Sequence[Sequence[int]], block_size: int = 16) -> float:
    """Fraction of prompt tokens in full blocks an earlier prompt already holds: the hit
    rate an ideal prefix cache gets running `prompts` in order (a check on W4's design)."""
    seen: set[tuple[int, ...]] = set()
    hits = total = 0
    for prompt in prompts:
        total += len(prompt)
        for end in range(block_size, len(prompt) + 1, block_size):
            key = tuple(prompt[:end])
            hits += block_size if key in seen else 0
            seen.add(key)
    return hits / total if total else 0.0


# ---- core through the LLM API ----------------------------------------------------------


def load_core(gguf_path: Path, **engine_args: Any) -> LLM:
    """A new engine. Engines dropped earlier are collected first: each holds a KV cache of
    up to 4 GiB, and two or three alive at once would crowd the machine's memory."""
    gc.collect()
    return LLM(str(gguf_path), **engine_args)


def core_w1(llm: LLM, prompts: Prompts, sizes: Sizes) -> Metrics:
    result = benchmark_throughput(llm, prompts, sizes.w1_output_len)
    return {**result.to_dict(), "how": f"LLM.generate, all requests at once, {_precision(llm)}"}


def core_w2(llm: LLM, sizes: Sizes) -> Metrics:
    result = benchmark_latency(
        llm, sizes.w2_input_len, sizes.w2_output_len, num_iters=sizes.w2_num_iters, warmup=W2_WARMUP
    )
    how = f"LLM.generate, one request at a time, {_precision(llm)}"
    return {**latency_metrics(result), "how": how}


def engine_dtype(llm: LLM) -> str:
    """The dtype the engine computes in (the platform's default unless one was asked for),
    e.g. "bfloat16"."""
    return str(llm.engine.core.executor.worker.dtype).removeprefix("torch.")


def _precision(llm: LLM) -> str:
    """`engine_dtype` and, when its weights stay quantized, the method holding them."""
    dtype = engine_dtype(llm)
    method = llm.engine.core.executor.worker.config.model.quantization
    if method is None:
        return dtype
    provider = quant_linear_provider()
    how = f"{dtype}, {method} weights, core::quant_linear by {provider}"
    return how + (", int8 activations" if _int8_activations(provider) else "")


def _int8_activations(provider: str) -> bool:
    """Whether core-cpu-kernels, serving core::quant_linear, was asked for int8 activations."""
    if provider != "core-cpu-kernels":
        return False
    from core_cpu_kernels.candidates import int8_activations

    return int8_activations()


def quant_linear_provider() -> str:
    """Who serves core::quant_linear (every packed weight's matmul) on the CPU in this
    process: a kernel's provider, or "reference" (dequantize, then a torch matmul)."""
    from core.ops import REFERENCE, providers

    return providers().get("quant_linear", {}).get("cpu", REFERENCE)


def latency_metrics(result: LatencyResult) -> Metrics:
    return single_stream_metrics(result.ttft_ms.median, result.tpot_ms.median)


def single_stream_metrics(ttft_ms: float, tpot_ms: float) -> Metrics:
    return {"ttft_ms": ttft_ms, "tpot_ms": tpot_ms, "decode_tokens_per_s": 1000.0 / tpot_ms}


def core_w4(gguf_path: Path, tokenizer: Any, sizes: Sizes) -> Metrics:
    """Every repeat with prefix caching on, then every repeat with it off (one engine each),
    and the hit rate an ideal cache would get on each prompt set."""
    prompts = [w4_prompts(tokenizer, sizes, repeat) for repeat in range(sizes.w4_repeats)]
    block_size = CacheConfig().block_size
    return {
        "caching_on": _w4_runs(gguf_path, True, prompts, sizes),
        "caching_off": _w4_runs(gguf_path, False, prompts, sizes),
        "ideal_hit_fraction": {
            "shared": shared_block_fraction(prompts[0].shared, block_size),
            "unshared": shared_block_fraction(prompts[0].unshared, block_size),
        },
    }


def _w4_runs(
    gguf_path: Path, caching: bool, prompts: list[W4Prompts], sizes: Sizes
) -> list[Metrics]:
    llm = load_core(gguf_path, enable_prefix_caching=caching)
    try:
        return [_w4_repeat(llm, repeat_prompts, sizes) for repeat_prompts in prompts]
    finally:
        llm.engine.shutdown()


def _w4_repeat(llm: LLM, prompts: W4Prompts, sizes: Sizes) -> Metrics:
    shared = benchmark_throughput(llm, prompts.shared, sizes.w4_output_len)
    ttfts = [_ttft_ms(llm, prompt) for prompt in prompts.probes]
    unshared = benchmark_throughput(llm, prompts.unshared, sizes.w4_output_len)
    return {
        "shared_ttft_ms": median(ttfts[1:]),
        "shared_requests_per_s": shared.requests_per_s,
        "shared_output_tokens_per_s": shared.output_tokens_per_s,
        "unshared_requests_per_s": unshared.requests_per_s,
        "unshared_output_tokens_per_s": unshared.output_tokens_per_s,
    }


def _ttft_ms(llm: LLM, prompt: list[int]) -> float:
    """Wall time of a one-token request on an idle engine: its time to first token."""
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    llm.generate([prompt], params, use_tqdm=False)
    return (time.perf_counter() - start) * 1000.0


# ---- servers: core serve and llama-server alike ------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def thread_env(num_threads: int) -> dict[str, str]:
    """This process's environment with the thread count pinned for a child's torch/OpenMP."""
    return {**os.environ, "OMP_NUM_THREADS": str(num_threads)}


@contextmanager
def server_process(
    command: list[str],
    base_url: str,
    env: dict[str, str],
    timeout_s: float = 600.0,
    reap_group: bool = False,
) -> Iterator[str]:
    """Run a server until the block ends, yielding `base_url` once GET /health answers 200.

    Stopped with SIGTERM (the server's own shutdown path), then killed with its process
    group if it has not exited after 60 s. With `reap_group`, whatever is left of its
    process group once it has stopped is killed too: for servers whose children outlive
    them (vLLM's engine core busy-polls when orphaned). A server that dies or never gets
    healthy raises RuntimeError with the tail of its log.
    """
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            _wait_healthy(process, base_url, timeout_s, log)
            yield base_url
        finally:
            _stop(process)
            if reap_group:
                kill_group(process.pid)


def _wait_healthy(process: subprocess.Popen, base_url: str, timeout_s: float, log: Any) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}:\n{_tail(log)}")
        if _healthy(base_url):
            return
        time.sleep(0.5)
    raise RuntimeError(f"server not healthy after {timeout_s:.0f} s:\n{_tail(log)}")


def _healthy(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=5) as response:
            return response.status == 200
    except OSError:  # refused while starting, 503 while loading (HTTPError is an OSError)
        return False


def _tail(log: Any, num_bytes: int = 4000) -> str:
    log.seek(0)
    return log.read().decode(errors="replace")[-num_bytes:]


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        process.wait()


def kill_group(pgid: int) -> None:
    """SIGKILL every process still in process group `pgid` (a child started with
    `start_new_session` leads its own group, whose id is its pid); none left is fine."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def served_model_id(base_url: str) -> str:
    import json

    with urllib.request.urlopen(f"{base_url}/v1/models", timeout=10) as response:
        return json.load(response)["data"][0]["id"]


def serve_load(
    base_url: str, prompts: Prompts, output_len: int, max_concurrency: int
) -> ServeResult:
    """`prompts` sent to a running server, at most `max_concurrency` in flight."""
    model = served_model_id(base_url)
    return asyncio.run(
        benchmark_serving(base_url, model, prompts, output_len, max_concurrency=max_concurrency)
    )


def serve_metrics(result: ServeResult) -> Metrics:
    """W3's figures (and W1's, for an engine measured through its server)."""
    return {
        "num_requests": result.num_requests,
        "num_failed": result.num_failed,
        "requests_per_s": result.request_throughput,
        "output_tokens_per_s": result.output_throughput,
        "total_tokens_per_s": result.total_token_throughput,
        "ttft_median_ms": result.ttft_ms.median,
        "ttft_p99_ms": result.ttft_ms.p99,
        "itl_median_ms": result.itl_ms.median,
        "itl_p99_ms": result.itl_ms.p99,
        "tpot_median_ms": result.tpot_ms.median,
        "errors": result.errors,
    }


def served(
    base_url: str, prompts: Prompts, output_len: int, max_concurrency: int, server: str
) -> Metrics:
    """`serve_metrics` of one load run, with how it was run (`server` names the server)."""
    result = serve_load(base_url, prompts, output_len, max_concurrency)
    how = f"{server}: {len(prompts)} requests at max concurrency {max_concurrency}"
    return {**serve_metrics(result), "how": how}


def core_serve_command(gguf_path: Path, port: int) -> list[str]:
    entry = "from core.entrypoints.cli import main; main()"
    return [sys.executable, "-c", entry, "serve", str(gguf_path),
            "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip


def core_w3(gguf_path: Path, prompts: Prompts, sizes: Sizes, num_threads: int) -> Metrics:
    """W3's figures, and `start_s`: seconds from launching `core serve` to its first healthy
    /health (caches warm when core's offline runs came first)."""
    port = free_port()
    command = core_serve_command(gguf_path, port)
    start = time.perf_counter()
    with server_process(command, f"http://127.0.0.1:{port}", thread_env(num_threads)) as url:
        start_s = time.perf_counter() - start
        found = served(url, prompts, sizes.w1_output_len, sizes.w3_max_concurrency, "core serve")
    return {**found, "start_s": start_s}


__all__ = [
    "FULL",
    "QUICK",
    "Metrics",
    "Prompts",
    "Sizes",
    "W4Prompts",
    "core_w1",
    "core_w2",
    "core_w3",
    "core_w4",
    "engine_dtype",
    "free_port",
    "kill_group",
    "latency_metrics",
    "load_core",
    "quant_linear_provider",
    "serve_load",
    "serve_metrics",
    "served",
    "server_process",
    "shared_block_fraction",
    "single_stream_metrics",
    "thread_env",
    "w1_prompts",
    "w2_prompts",
    "w4_prompts",
]
