"""Offline throughput: every prompt handed to `LLM.generate` at once, timed end to end."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from core.entrypoints.bench.results import ThroughputResult
from core.entrypoints.bench.speculation import SpeculationMeter
from core.lora.request import LoRARequest
from core.sampling_params import SamplingParams

if TYPE_CHECKING:
    from core.entrypoints.llm import LLM


def output_lens_for(prompts: list, output_len: int | list[int]) -> list[int]:
    """One output length per prompt; ValueError when a list does not match the prompts."""
    lens = [output_len] * len(prompts) if isinstance(output_len, int) else list(output_len)
    if len(lens) != len(prompts):
        raise ValueError(f"output_len has {len(lens)} entries for {len(prompts)} prompts")
    if any(n < 1 for n in lens):
        raise ValueError(f"output_len must be >= 1, got {min(lens)}")
    return lens


def benchmark_throughput(
    llm: LLM,
    prompts: list[list[int]],
    output_len: int | list[int],
    ignore_eos: bool = True,
    lora_requests: list[LoRARequest | None] | None = None,
) -> ThroughputResult:
    """Generate greedily for all `prompts` (token ids) and report tokens per second.

    One warm-up request runs first, untimed: the first prompt reversed, so it shares no
    prefix-cache block with the timed prompts; with `lora_requests` (one per prompt), one
    warm-up per distinct adapter, so none is read from disk while timed. Output tokens are
    those actually produced (fewer than asked when `ignore_eos` is off and a request stops
    early). With speculative decoding on, the acceptance figures count the timed requests'
    drafts only.
    """
    if not prompts:
        raise ValueError("prompts must not be empty")
    params = [
        SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=ignore_eos)
        for n in output_lens_for(prompts, output_len)
    ]
    warmups = list(dict.fromkeys(lora_requests or [None]))
    llm.generate([prompts[0][::-1]] * len(warmups), params[0], use_tqdm=False, lora_request=warmups)
    meter = SpeculationMeter(llm)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False, lora_request=lora_requests)
    duration = time.perf_counter() - start
    prompt_tokens = sum(len(o.prompt_token_ids) for o in outputs)
    output_tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    return ThroughputResult(
        num_requests=len(outputs),
        duration_s=duration,
        requests_per_s=len(outputs) / duration,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        output_tokens_per_s=output_tokens / duration,
        total_tokens_per_s=(prompt_tokens + output_tokens) / duration,
        **meter.figures(),
    )


__all__ = ["benchmark_throughput", "output_lens_for"]
