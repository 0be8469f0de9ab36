"""W5, copy-heavy decoding, and W2 again, on core with each speculative decoding method.

One engine per method, none first: W5 single stream (one request at a time, median time
per output token), W5 with all streams submitted at once (output tok/s), then W2's random
prose one request at a time (where drafts rarely hit: the cost of speculating for
nothing). Acceptance figures count the timed requests' drafts only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.copy_prompts import copy_prompts
from benchmarks.workloads import W2_WARMUP, Metrics, Prompts, Sizes, latency_metrics, load_core
from core.entrypoints.bench.latency import benchmark_latency, benchmark_latency_batches
from core.entrypoints.bench.results import LatencyResult, ThroughputResult
from core.entrypoints.bench.throughput import benchmark_throughput

__all__ = ["LAYER_SKIP", "core_w5", "speculative_configs"]

W5_SEED, W5_WARMUP = 500, 1
# The fastest in a scan of num_layers 2-28 and k 1-4 on W5 single stream (README.md): no
# setting beat no speculation on SmolLM2-135M, so the cheapest draft costs least.
LAYER_SKIP = {"method": "layer_skip", "num_speculative_tokens": 1, "num_layers": 4}


def speculative_configs(gguf_path: Path) -> dict[str, dict[str, Any] | None]:
    """The methods W5 compares, by name; "none" is speculation off. The draft model is the
    target itself: no smaller sibling ships, so only its overhead can be measured."""
    return {
        "none": None,
        "ngram": {"method": "ngram", "num_speculative_tokens": 4,
                  "prompt_lookup_min": 2, "prompt_lookup_max": 5},
        "layer_skip": LAYER_SKIP,
        "draft_model": {"method": "draft_model", "model": str(gguf_path),
                        "num_speculative_tokens": 3},
    }  # fmt: skip


def core_w5(gguf_path: Path, tokenizer: Any, sizes: Sizes) -> Metrics:
    """{"methods": {name: {"speculative_config", "w5_single", "w5_streams", "w2"}},
    "num_streams", "how"}: every method of `speculative_configs` in turn."""
    single = copy_prompts(tokenizer, W5_WARMUP + sizes.w5_num_iters, sizes.w5_copy_len, W5_SEED)
    streams = copy_prompts(tokenizer, sizes.w5_num_streams, sizes.w5_copy_len, W5_SEED + 1)
    methods = {}
    for name, config in speculative_configs(gguf_path).items():
        llm = load_core(gguf_path, speculative_config=config)
        methods[name] = {"speculative_config": config, **_method_runs(llm, single, streams, sizes)}
    prompt_lens = [len(p) for p in single + streams]
    how = (f"one engine per method; W5: {sizes.w5_num_iters} prompts one at a time (after "
           f"{W5_WARMUP} warm-up) and {sizes.w5_num_streams} at once, {sizes.w5_output_len} "
           f"tokens out, prompts of {min(prompt_lens)}-{max(prompt_lens)} tokens")  # fmt: skip
    return {"methods": methods, "num_streams": sizes.w5_num_streams, "how": how}


def _method_runs(llm: Any, single: Prompts, streams: Prompts, sizes: Sizes) -> Metrics:
    """W5 single stream, W5 streams and W2 on one engine, shut down on return."""
    try:
        w5_single = benchmark_latency_batches(
            llm, [[prompt] for prompt in single], sizes.w5_output_len, warmup=W5_WARMUP
        )
        w5_streams = benchmark_throughput(llm, streams, sizes.w5_output_len)
        w2 = benchmark_latency(llm, sizes.w2_input_len, sizes.w2_output_len,
                               num_iters=sizes.w2_num_iters, warmup=W2_WARMUP)  # fmt: skip
    finally:
        llm.engine.shutdown()
    return {
        "w5_single": _single_metrics(w5_single),
        "w5_streams": _streams_metrics(w5_streams),
        "w2": _single_metrics(w2),
    }


def _single_metrics(result: LatencyResult) -> Metrics:
    return {**latency_metrics(result), **_acceptance(result)}


def _streams_metrics(result: ThroughputResult) -> Metrics:
    return {"output_tokens_per_s": result.output_tokens_per_s, **_acceptance(result)}


def _acceptance(result: LatencyResult | ThroughputResult) -> Metrics:
    return {
        "acceptance_rate": result.acceptance_rate,
        "mean_accepted_length": result.mean_accepted_length,
    }
