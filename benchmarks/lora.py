"""W6, multi-LoRA: W1's requests on the base model alone, then with 1, 2 and 4 adapters of
rank 16 on every projection, assigned round-robin, all in one engine with 4 slots.

Prefix caching is off in every run (the same prompts recur across runs; a hit would time
the cache, not the adapters). The adapters are random (core.testing.lora_adapters), in
PEFT's format, written once into the benchmark cache: their speed does not depend on
what they were trained for. The overhead per adapter slot is the throughput lost per
extra distinct adapter in the batch, from the 1- and 4-adapter runs.
"""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

from benchmarks.cache import cache_root
from benchmarks.workloads import Metrics, Prompts, Sizes, load_core
from core.entrypoints.bench.throughput import benchmark_throughput
from core.lora.request import LoRARequest
from core.model_loader import resolve_model
from core.testing.lora_adapters import AdapterSpec, write_adapter

__all__ = ["LORA_RANK", "core_w6"]

LORA_RANK = 16
NUM_ADAPTERS = (1, 2, 4)
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def adapters(gguf_path: Path) -> list[LoRARequest]:
    """Four rank-16 adapters of the model, written on first use."""
    root = cache_root() / f"lora-r{LORA_RANK}-{gguf_path.stem}"
    requests = [LoRARequest(f"w6-{i}", i + 1, str(root / f"a{i}")) for i in range(4)]
    if all((Path(r.lora_path) / "adapter_model.safetensors").exists() for r in requests):
        return requests
    config = transformers.AutoConfig.for_model(**resolve_model(str(gguf_path)).hf_config)
    with torch.device("meta"):  # shapes and names only
        model = transformers.AutoModelForCausalLM.from_config(config)
    for i, request in enumerate(requests):
        spec = AdapterSpec(rank=LORA_RANK, alpha=2 * LORA_RANK, targets=TARGETS, seed=i)
        write_adapter(Path(request.lora_path), model, spec)
    return requests


def core_w6(gguf_path: Path, prompts: Prompts, sizes: Sizes) -> Metrics:
    """{"base": W1 metrics, "adapters": {n: W1 metrics}, "overhead_per_slot", "how"}."""
    requests = adapters(gguf_path)
    output_len = sizes.w1_output_len
    base = load_core(gguf_path, enable_prefix_caching=False)
    try:
        found: Metrics = {"base": benchmark_throughput(base, prompts, output_len).to_dict()}
    finally:
        base.engine.shutdown()
    llm = load_core(
        gguf_path,
        enable_prefix_caching=False,
        enable_lora=True,
        max_loras=max(NUM_ADAPTERS),
        max_lora_rank=LORA_RANK,
    )
    try:
        found["adapters"] = {
            n: benchmark_throughput(
                llm,
                prompts,
                output_len,
                lora_requests=[requests[i % n] for i in range(len(prompts))],
            ).to_dict()
            for n in NUM_ADAPTERS
        }
    finally:
        llm.engine.shutdown()
    one, four = (found["adapters"][n]["total_tokens_per_s"] for n in (1, 4))
    found["overhead_per_slot"] = (one - four) / one / 3  # share of throughput per extra adapter
    found["how"] = (
        f"LLM.generate, {len(prompts)} W1 prompts at once, prefix caching off, adapters of "
        f"rank {LORA_RANK} on q/k/v/o/gate/up/down round-robin over the prompts"
    )
    return found
