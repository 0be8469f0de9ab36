"""GET /metrics after a known workload through the server's app over a real engine (the tiny
random-weight model): every vLLM series is there under the chosen --metrics-prefix with the
model and engine labels, and the counts add up to what the workload did.

The requests run one after another, each prompt fitting one step, so every request takes
exactly as many engine steps as it generates tokens. The step budget is set, hence fixed: a
server's default budget is sized from measured step times, which on a busy machine can
split a prompt over two steps.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tiny_engine_checkpoint import engine_args, write_tiny_checkpoint

from core.engine.async_llm import AsyncLLM
from core.entrypoints.openai.api_server import build_app

BLOCK_SIZE = 4
REPEATED = list(range(3, 12))  # 9 tokens
# (prompt token ids, tokens to generate), sent in this order.
WORKLOAD = [(REPEATED, 4), (REPEATED, 3), ([20, 21, 22], 5)]
# The second REPEATED finds its first two blocks cached (8 tokens); its last token is
# always computed, and the partial third block is never cached.
NUM_CACHED = 8
NUM_PROMPT = sum(len(prompt) for prompt, _ in WORKLOAD)
NUM_GENERATED = sum(n for _, n in WORKLOAD)
NUM_REQUESTS = len(WORKLOAD)

COUNTERS = [
    "prompt_tokens_total", "generation_tokens_total", "request_success_total",
    "prefix_cache_queries_total", "prefix_cache_hits_total", "num_preemptions_total",
]  # fmt: skip
GAUGES = [
    "num_requests_running", "num_requests_waiting", "num_requests_waiting_by_reason",
    "kv_cache_usage_perc",
]  # fmt: skip
HISTOGRAMS = [
    "time_to_first_token_seconds", "inter_token_latency_seconds",
    "e2e_request_latency_seconds", "request_queue_time_seconds",
    "request_prefill_time_seconds", "request_decode_time_seconds",
    "request_inference_time_seconds", "iteration_tokens_total",
    "request_num_preemptions", "request_params_n", "request_params_max_tokens",
]  # fmt: skip
PER_REQUEST = [name for name in HISTOGRAMS if name.startswith(("request_", "e2e_", "time_"))]


@dataclass
class Scrape:
    prefix: str
    model: str
    num_gpu_blocks: int
    max_model_len: int
    samples: list  # prometheus_client Samples

    def series(self, name: str) -> list:
        return [s for s in self.samples if s.name == f"{self.prefix}:{name}"]

    def value(self, name: str, **labels: str) -> float:
        (sample,) = [s for s in self.series(name) if labels.items() <= s.labels.items()]
        return sample.value


async def run_workload(prefix: str, model_dir) -> Scrape:
    engine = await AsyncLLM.start(
        engine_args(
            model_dir, block_size=BLOCK_SIZE, metrics_prefix=prefix, max_num_batched_tokens=32
        )
    )
    try:
        transport = httpx.ASGITransport(app=build_app(engine))
        async with httpx.AsyncClient(transport=transport, base_url="http://core") as client:
            model = (await client.get("/v1/models")).json()["data"][0]["id"]
            for prompt, max_tokens in WORKLOAD:
                body = {"model": model, "prompt": prompt, "max_tokens": max_tokens,
                        "temperature": 0, "ignore_eos": True}  # fmt: skip
                response = await client.post("/v1/completions", json=body)
                assert response.json()["usage"]["completion_tokens"] == max_tokens
            text = (await client.get("/metrics")).text
    finally:
        engine.shutdown()
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    max_model_len = engine.processor.config.model.max_model_len
    return Scrape(prefix, model, engine.num_gpu_blocks, max_model_len, samples)


@pytest.fixture(scope="module", params=["vllm", "core"])
def scrape(request, tmp_path_factory) -> Scrape:
    model_dir = write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))
    return asyncio.run(run_workload(request.param, model_dir))


def test_every_series_is_under_the_prefix_with_model_and_engine_labels(scrape):
    names = [*COUNTERS, *GAUGES, "cache_config_info"]
    names += [f"{name}_{part}" for name in HISTOGRAMS for part in ("bucket", "count", "sum")]
    for name in names:
        series = scrape.series(name)
        assert series, f"no {scrape.prefix}:{name}"
        for sample in series:
            assert sample.labels["model_name"] == scrape.model, name
            assert sample.labels["engine"] == "0", name


def test_token_counters_add_up_to_the_prompts_and_outputs(scrape):
    assert scrape.value("prompt_tokens_total") == NUM_PROMPT
    assert scrape.value("generation_tokens_total") == NUM_GENERATED
    assert scrape.value("request_prompt_tokens_sum") == NUM_PROMPT
    assert scrape.value("request_generation_tokens_sum") == NUM_GENERATED


def test_request_params_are_what_the_requests_asked_and_none_was_preempted(scrape):
    # Each request generated exactly its max_tokens (ignore_eos), with n = 1.
    assert scrape.value("request_params_max_tokens_sum") == NUM_GENERATED
    assert scrape.value("request_params_n_sum") == NUM_REQUESTS
    assert scrape.value("request_params_n_bucket", le="1.0") == NUM_REQUESTS
    assert scrape.value("request_num_preemptions_sum") == 0


def test_every_request_succeeds_once_with_its_finish_reason(scrape):
    assert scrape.value("request_success_total", finished_reason="length") == NUM_REQUESTS
    for reason in ("stop", "abort", "error"):
        assert scrape.value("request_success_total", finished_reason=reason) == 0


def test_each_request_is_observed_once_by_each_per_request_histogram(scrape):
    for name in PER_REQUEST:
        assert scrape.value(f"{name}_count") == NUM_REQUESTS, name
        assert scrape.value(f"{name}_bucket", le="+Inf") == NUM_REQUESTS, name
    # A latency between every two tokens of a request.
    assert scrape.value("inter_token_latency_seconds_count") == NUM_GENERATED - NUM_REQUESTS


def test_iteration_tokens_observe_every_step_and_what_it_computed(scrape):
    assert scrape.value("iteration_tokens_total_count") == NUM_GENERATED
    assert scrape.value("iteration_tokens_total_sum") == NUM_PROMPT - NUM_CACHED + NUM_GENERATED


def test_prefix_cache_counts_every_prompt_token_and_the_repeated_blocks(scrape):
    assert scrape.value("prefix_cache_queries_total") == NUM_PROMPT
    assert scrape.value("prefix_cache_hits_total") == NUM_CACHED
    assert scrape.value("num_preemptions_total") == 0


def test_an_idle_engine_shows_nothing_running_or_waiting(scrape):
    assert scrape.value("num_requests_running") == 0
    assert scrape.value("num_requests_waiting") == 0
    for reason in ("capacity", "deferred"):
        assert scrape.value("num_requests_waiting_by_reason", reason=reason) == 0


def test_cache_config_info_shows_the_block_size_and_the_engines_blocks(scrape):
    labels = scrape.series("cache_config_info")[0].labels
    assert labels["block_size"] == str(BLOCK_SIZE)
    assert labels["num_gpu_blocks"] == str(scrape.num_gpu_blocks)
    assert scrape.value("cache_config_info") == 1
    # Block 0 holds no tokens; a request of max_model_len takes ceil(len / block) blocks.
    usable = scrape.num_gpu_blocks - 1
    assert labels["kv_cache_size_tokens"] == str(usable * BLOCK_SIZE)
    per_request = math.ceil(scrape.max_model_len / BLOCK_SIZE)
    assert float(labels["kv_cache_max_concurrency"]) == pytest.approx(usable / per_request)
