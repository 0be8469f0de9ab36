"""KV offloading across engines (issue 36): the TTFT of a W4 prompt (a 1,024-token shared
prefix and a fresh question) on a fresh engine whose `offload` connector finds the prefix
in the disk tier another engine wrote, against the same prompt computed cold.

    python -m benchmarks.kv_offload [--quick] [--repeats N]

Each repeat: engine A (one host slot, so every block it fills is spilled to disk) serves
the prefix with one question and stops; engine B, new, with the same directory, serves
another question: its prefix loads from disk. Engine C, new, without the connector,
serves that prompt cold. Each engine's first request is its only one, so no local prefix
cache helps; engines start before any timing and stop after.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from statistics import median

import torch

from benchmarks.workloads import FULL, QUICK, load_core, w4_prompts
from core.model_loader.resolve import default_model_path
from core.sampling_params import SamplingParams
from core.tokenizer import Tokenizer

TARGET = 4.0  # cold TTFT over the TTFT with the prefix from another engine's disk tier


def offload_config(directory: Path) -> str:
    extra = {"num_cpu_blocks": 1, "disk_path": str(directory)}
    return json.dumps({"kv_connector": "offload", "kv_role": "kv_both",
                       "kv_connector_extra_config": extra})  # fmt: skip


def ttft_s(gguf: Path, prompt: list[int], **engine_args) -> float:
    """Seconds to the first token of `prompt` on a fresh engine (its only request)."""
    llm = load_core(gguf, **engine_args)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=1)
        start = time.perf_counter()
        llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
        return time.perf_counter() - start
    finally:
        llm.engine.shutdown()


def one_repeat(gguf: Path, tokenizer: Tokenizer, repeat: int, quick: bool) -> tuple[float, float]:
    prompts = w4_prompts(tokenizer, QUICK if quick else FULL, repeat)
    writer, reader = prompts.probes[0], prompts.probes[1]
    with tempfile.TemporaryDirectory() as directory:
        config = offload_config(Path(directory))
        ttft_s(gguf, writer, kv_transfer_config=config)
        from_disk = ttft_s(gguf, reader, kv_transfer_config=config)
    return ttft_s(gguf, reader), from_disk


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.kv_offload")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    gguf = default_model_path()
    tokenizer = Tokenizer.from_gguf(gguf)
    runs = [one_repeat(gguf, tokenizer, r, args.quick) for r in range(args.repeats)]
    cold, warm = median(c for c, _ in runs), median(w for _, w in runs)
    print("| figure | seconds |\n|---|---|")
    print(f"| TTFT cold (median of {len(runs)}) | {cold:.3f} |")
    print(f"| TTFT, prefix from another engine's disk tier | {warm:.3f} |")
    print(f"\ncold / from disk: {cold / warm:.2f}x (target >= {TARGET:.0f}x)")


if __name__ == "__main__":
    main()
