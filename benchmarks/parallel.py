"""W7, tensor parallelism on the CPU: W1 on one worker with every thread, then on two
worker processes of one thread each (`--tensor-parallel-size 2`, gloo), and what the
collectives of one decode step cost on their own.

The default model cannot be split in two (9 heads, 3 KV heads), so both runs use a
random-weight model of SmolLM2-135M's shape with 8 heads of 72 and 2 KV heads (same
hidden size, MLP, layers and vocabulary: the same FLOPs and weight bytes, within 1%),
written once into the benchmark cache as float32 safetensors with the default model's
tokenizer. Its outputs are noise; W1 ignores EOS, so every request decodes all its
tokens. The communication share: a 2-process gloo run of exactly the collectives one
decode step of W1's batch makes (two all-reduces of [batch, hidden] per layer, an
all-reduce for the embedding rows and an all-gather of the logits), timed alone and
divided by the TP=2 decode step's time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from benchmarks.cache import cache_root
from benchmarks.workloads import Metrics, Prompts, Sizes, load_core
from core.entrypoints.bench.throughput import benchmark_throughput
from core.model_loader import resolve_model

__all__ = ["core_w7"]

SHAPE = {"num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 72}


def split_model(gguf_path: Path) -> Path:
    """The SmolLM2-shaped, TP-2-divisible random model, written on first use."""
    directory = cache_root() / f"tp2-shaped-{gguf_path.stem}"
    if (directory / "model.safetensors").exists():
        return directory
    import transformers

    checkpoint = resolve_model(str(gguf_path))
    config = transformers.AutoConfig.for_model(**{**checkpoint.hf_config, **SHAPE})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    partial = directory.with_suffix(".partial")
    model.save_pretrained(partial)
    checkpoint_tokenizer(gguf_path).save(partial)
    partial.rename(directory)
    return directory


def checkpoint_tokenizer(gguf_path: Path):
    from core.tokenizer import load_tokenizer

    return load_tokenizer(resolve_model(str(gguf_path)))


def core_w7(gguf_path: Path, prompts: Prompts, sizes: Sizes, threads: int) -> Metrics:
    """{"tp1", "tp2": W1 metrics, "comm": {...}, "how"}."""
    model = split_model(gguf_path)
    found: Metrics = {}
    for name, args in (("tp1", {}), ("tp2", {"tensor_parallel_size": 2})):
        llm = load_core(model, dtype="float32", enable_prefix_caching=False, **args)
        steps = _StepCounter(llm)
        try:
            found[name] = benchmark_throughput(llm, prompts, sizes.w1_output_len).to_dict()
        finally:
            llm.engine.shutdown()
        found[name]["mean_step_s"] = found[name]["duration_s"] / steps.timed
    found["comm"] = collective_step_seconds(model, min(len(prompts), 64))
    found["comm"]["share_of_mean_step"] = found["comm"]["seconds"] / found["tp2"]["mean_step_s"]
    found["how"] = (
        f"LLM.generate, {len(prompts)} W1 prompts at once, prefix caching off, a random "
        f"model of SmolLM2-135M's shape with 8 heads (float32); TP=1: one worker, {threads} "
        "threads; TP=2: two worker processes, one thread each, gloo"
    )
    return found


class _StepCounter:
    """The engine core steps of benchmark_throughput's timed run (its first generate call
    is the warm-up)."""

    def __init__(self, llm) -> None:
        self.calls, self.warmup = 0, None
        core, generate = llm.engine.core, llm.generate
        step = core.step

        def counted():
            self.calls += 1
            return step()

        def generate_then_mark(*args, **kwargs):
            outputs = generate(*args, **kwargs)
            if self.warmup is None:
                self.warmup = self.calls
            return outputs

        core.step, llm.generate = counted, generate_then_mark

    @property
    def timed(self) -> int:
        return self.calls - self.warmup


def collective_step_seconds(model: Path, batch: int) -> Metrics:
    """The collectives of one TP=2 decode step of `batch` requests, timed alone in two
    gloo processes: {"seconds", "bytes"} per step."""
    config = json.loads((model / "config.json").read_text())
    command = [sys.executable, "-m", "benchmarks.parallel", str(config["num_hidden_layers"]),
               str(config["hidden_size"]), str(config["vocab_size"]), str(batch)]  # fmt: skip
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _collectives(rank: int, layers: int, hidden: int, vocab: int, batch: int, port: int):
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    activations = torch.randn(batch, hidden)
    logits = torch.randn(batch, vocab // 2)
    gathered = torch.empty(batch * 2, vocab // 2)

    def step() -> None:
        dist.all_reduce(activations)  # the embedding rows
        for _ in range(layers):
            dist.all_reduce(activations)  # after o_proj
            dist.all_reduce(activations)  # after down_proj
        dist.all_gather_single(gathered, logits)

    for _ in range(3):
        step()
    dist.barrier()
    start, repeats = time.perf_counter(), 20
    for _ in range(repeats):
        step()
    seconds = (time.perf_counter() - start) / repeats
    if rank == 0:
        volume = 4 * batch * ((2 * layers + 1) * hidden + vocab // 2)
        print(json.dumps({"seconds": seconds, "bytes": volume}))
    dist.destroy_process_group()


if __name__ == "__main__":
    layers, hidden, vocab, batch = (int(v) for v in sys.argv[1:5])
    from core.executor.multiproc import _free_port

    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    peer = subprocess.Popen(
        [sys.executable, "-c", "import sys, benchmarks.parallel as p; "
         f"p._collectives(1, {layers}, {hidden}, {vocab}, {batch}, {port})"],
        env=env,
    )  # fmt: skip
    _collectives(0, layers, hidden, vocab, batch, port)
    peer.wait()
