"""Latency of one batch at a time, through the streaming LLMEngine API."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from core.engine.output_processor import RequestOutputKind
from core.entrypoints.bench.datasets import synthetic_prompts
from core.entrypoints.bench.results import LatencyResult, Percentiles
from core.entrypoints.bench.speculation import SpeculationMeter
from core.sampling_params import SamplingParams

if TYPE_CHECKING:
    from core.engine.llm_engine import LLMEngine
    from core.entrypoints.llm import LLM


@dataclass
class _Timing:
    """Seconds since the batch was submitted: each output token's arrival, and the finish."""

    token_times: list[float]
    finish_time: float

    def ttft_ms(self) -> float:
        return self.token_times[0] * 1000.0

    def tpot_ms(self) -> float | None:
        """Mean time per output token after the first (None with a single token)."""
        if len(self.token_times) < 2:
            return None
        return (self.token_times[-1] - self.token_times[0]) * 1000.0 / (len(self.token_times) - 1)


def benchmark_latency(
    llm: LLM,
    input_len: int,
    output_len: int,
    batch_size: int = 1,
    num_iters: int = 5,
    warmup: int = 1,
) -> LatencyResult:
    """Run `warmup` untimed then `num_iters` timed batches of `batch_size` requests.

    Each batch has fresh synthetic prompts (the iteration is the seed), so no prefix-cache
    hit flatters TTFT. Timing as in `benchmark_latency_batches`.
    """
    for name, value, least in (("batch_size", batch_size, 1), ("num_iters", num_iters, 1),
                               ("warmup", warmup, 0)):  # fmt: skip
        if value < least:
            raise ValueError(f"{name} must be >= {least}, got {value}")
    tokenizer = llm.get_tokenizer()
    batches = [
        synthetic_prompts(tokenizer, batch_size, input_len, seed=iteration)
        for iteration in range(warmup + num_iters)
    ]
    return benchmark_latency_batches(llm, batches, output_len, warmup)


def benchmark_latency_batches(
    llm: LLM, batches: Sequence[list[list[int]]], output_len: int, warmup: int = 1
) -> LatencyResult:
    """Run `batches` of token-id prompts one batch at a time, the first `warmup` untimed.

    A token's time is when `engine.step()` returns it, so TTFT includes queueing and
    prefill, and TPOT is (last token - first token) / (tokens - 1). The result's input_len
    is the timed prompts' mean length (rounded), its batch_size the first timed batch's.
    With speculative decoding on, the acceptance figures count the timed batches' drafts.
    """
    if output_len < 1:
        raise ValueError(f"output_len must be >= 1, got {output_len}")
    if not 0 <= warmup < len(batches) or not all(batches):
        raise ValueError(f"need non-empty batches, more of them than warmup ({warmup})")
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    for batch in batches[:warmup]:
        _run_batch(llm.engine, batch, params)
    meter = SpeculationMeter(llm)
    timed = batches[warmup:]
    timings = [timing for batch in timed for timing in _run_batch(llm.engine, batch, params)]
    tpots = [t for t in (timing.tpot_ms() for timing in timings) if t is not None]
    prompt_lens = [len(prompt) for batch in timed for prompt in batch]
    return LatencyResult(
        batch_size=len(timed[0]),
        input_len=round(sum(prompt_lens) / len(prompt_lens)),
        output_len=output_len,
        num_iters=len(timed),
        ttft_ms=Percentiles.of([t.ttft_ms() for t in timings]),
        tpot_ms=Percentiles.of(tpots),
        e2e_ms=Percentiles.of([t.finish_time * 1000.0 for t in timings]),
        **meter.figures(),
    )


def _run_batch(
    engine: LLMEngine, prompts: list[list[int]], params: SamplingParams
) -> list[_Timing]:
    start = time.perf_counter()
    request_ids = [engine.new_request_id() for _ in prompts]
    for request_id, prompt in zip(request_ids, prompts, strict=True):
        engine.add_request(request_id, prompt, params, output_kind=RequestOutputKind.DELTA)
    token_times: dict[str, list[float]] = {request_id: [] for request_id in request_ids}
    finish_times: dict[str, float] = {}
    while len(finish_times) < len(request_ids):
        outputs = engine.step()
        now = time.perf_counter() - start
        for output in outputs:
            num_new = sum(len(sample.token_ids) for sample in output.outputs)
            token_times[output.request_id] += [now] * num_new
            if output.finished:
                finish_times[output.request_id] = now
    return [_Timing(token_times[r], finish_times[r]) for r in request_ids]


__all__ = ["benchmark_latency", "benchmark_latency_batches"]
