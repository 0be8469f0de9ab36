"""Hugging Face transformers as a peer: `generate` with static batching and left padding,
float32, loading the same GGUF file (transformers dequantizes it; needs `accelerate`).

Runs in this process, on torch's current thread count.
"""

from __future__ import annotations

import time
from pathlib import Path
from statistics import median
from typing import Any

import torch
from transformers import AutoModelForCausalLM
from transformers.generation.streamers import BaseStreamer

from benchmarks.workloads import Metrics, Prompts, single_stream_metrics


def load(gguf_path: Path) -> Any:
    """The model in float32, in eval mode (about 40 s on two cores: it dequantizes)."""
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
    )
    return model.eval()


def version() -> str:
    import transformers

    return transformers.__version__


def left_padded(prompts: Prompts, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids and attention_mask, both [B, max_len], prompts aligned to the right."""
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)  # [B, T]
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)  # [B, T]
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt) :] = torch.tensor(prompt)
        attention_mask[row, width - len(prompt) :] = 1
    return input_ids, attention_mask


def generate(model: Any, prompts: Prompts, output_len: int, streamer: Any = None) -> torch.Tensor:
    """Greedy, exactly `output_len` new tokens per prompt (EOS cannot end a row early).

    Returns the new tokens, [B, output_len]; raises RuntimeError if the length differs.
    """
    pad_id = _pad_id(model)
    input_ids, attention_mask = left_padded(prompts, pad_id)
    with torch.inference_mode():
        output = model.generate(
            input_ids=input_ids, attention_mask=attention_mask, do_sample=False,
            max_new_tokens=output_len, min_new_tokens=output_len, pad_token_id=pad_id,
            streamer=streamer,
        )  # fmt: skip
    new_tokens = output[:, input_ids.shape[1] :]  # [B, output_len]
    if new_tokens.shape[1] != output_len:
        raise RuntimeError(f"transformers made {new_tokens.shape[1]} tokens, not {output_len}")
    return new_tokens


def _pad_id(model: Any) -> int:
    """Any id will do (the mask hides padding); the model's own pad or EOS id keeps
    transformers from warning."""
    config = model.generation_config
    candidate = config.pad_token_id if config.pad_token_id is not None else config.eos_token_id
    if isinstance(candidate, list):
        candidate = candidate[0] if candidate else None
    return 0 if candidate is None else int(candidate)


def throughput(model: Any, prompts: Prompts, output_len: int, batch_size: int) -> Metrics:
    """W1 with static batches of `batch_size` prompts, in the given order."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    start = time.perf_counter()
    for first in range(0, len(prompts), batch_size):
        generate(model, prompts[first : first + batch_size], output_len)
    duration = time.perf_counter() - start
    output_tokens = len(prompts) * output_len
    prompt_tokens = sum(len(p) for p in prompts)
    return {
        "batch_size": batch_size,
        "duration_s": duration,
        "requests_per_s": len(prompts) / duration,
        "output_tokens_per_s": output_tokens / duration,
        "total_tokens_per_s": (prompt_tokens + output_tokens) / duration,
    }


def best_throughput(
    model: Any, prompts: Prompts, output_len: int, batch_sizes: tuple[int, ...]
) -> Metrics:
    """W1 at each batch size; the best (by output tokens/s) is the headline, all are kept."""
    runs = [throughput(model, prompts, output_len, b) for b in batch_sizes]
    best = max(runs, key=lambda run: run["output_tokens_per_s"])
    sizes = ", ".join(str(b) for b in batch_sizes)
    how = f"generate, static batches of {sizes} (best: {best['batch_size']}), left padding, fp32"
    return {**best, "by_batch_size": runs, "how": how}


class TokenClock(BaseStreamer):
    """Records when `generate` hands over each new token (its first call is the prompt)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.token_times: list[float] = []
        self._saw_prompt = False

    def put(self, value: torch.Tensor) -> None:
        if self._saw_prompt:
            self.token_times.append(time.perf_counter())
        self._saw_prompt = True

    def end(self) -> None:
        pass


def single_stream(model: Any, prompts: Prompts, output_len: int) -> Metrics:
    """W2: one prompt at a time; the first prompt only warms up. Medians over the rest."""
    if output_len < 2:
        raise ValueError(f"output_len must be >= 2 to time tokens after the first: {output_len}")
    if len(prompts) < 2:
        raise ValueError("single_stream needs a warm-up prompt and at least one more")
    ttfts, tpots = [], []
    for index, prompt in enumerate(prompts):
        clock = TokenClock()
        generate(model, [prompt], output_len, streamer=clock)
        times = clock.token_times
        if index > 0:
            ttfts.append((times[0] - clock.start) * 1000.0)
            tpots.append((times[-1] - times[0]) * 1000.0 / (len(times) - 1))
    metrics = single_stream_metrics(median(ttfts), median(tpots))
    return {**metrics, "how": "generate, batch 1, fp32"}


__all__ = [
    "TokenClock",
    "best_throughput",
    "generate",
    "left_padded",
    "load",
    "single_stream",
    "throughput",
    "version",
]
