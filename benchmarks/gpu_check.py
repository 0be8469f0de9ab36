"""Every GPU check of the GPU path in one script, for a lent GPU machine (<= 10 minutes).

    python -m benchmarks.gpu_check [--quick] [--skip-kit]

It installs nothing: run it in the environment `nox -s tests` builds, with core-cuda (or
core-rocm) and core-attn-flash installed. In order:

1. The conformance kit's attention checks of `flash` on the GPU
   (`--core-conformance=attention:flash --core-conformance-device=cuda`): the Triton
   kernels against the CPU reference on paged batches, every declared dtype.
2. Greedy parity on the default model (SmolLM2-135M, float32 weights): core with
   `flash` and core with `torch_ref` against transformers on the GPU, per prompt:
   identical, or the first divergence and whether transformers' top-2 gap there is a
   near-tie (DESIGN.md section 5).
3. W1 and W2 (benchmarks/README.md) at -O0, -O1 and -O2 (bfloat16), with each engine's
   startup time and, at -O2, the time graph capture took.
4. W2's decode tokens/s against the HBM bound: one decode step reads every weight once,
   so tokens/s <= copy bandwidth / weight bytes, the bandwidth measured here by a device
   copy.

Prints one table (markdown) at the end; paste it into benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import gc
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from benchmarks.workloads import FULL, QUICK, Sizes, core_w1, core_w2, load_core, w1_prompts
from core.model_loader.resolve import default_model_path

PARITY_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
]
PARITY_TOKENS = 32
NEAR_TIE = 1e-4  # of the logit scale (DESIGN.md section 5)


@contextmanager
def engine(gguf: Path, **engine_args: Any) -> Iterator[Any]:
    """An in-process engine, shut down and its device memory returned on exit: the next
    one profiles the device and needs --gpu-memory-utilization of it free."""
    llm = load_core(gguf, **engine_args)
    try:
        yield llm
    finally:
        llm.engine.shutdown()
        del llm
        gc.collect()
        torch.cuda.empty_cache()


def kit(rows: list[tuple[str, str]]) -> None:
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "--core-conformance=attention:flash", "--core-conformance-device=cuda"]  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    summary = (done.stdout.strip().splitlines() or ["no output"])[-1]
    rows.append(("kit attention:flash on cuda", f"{summary} ({time.perf_counter() - start:.0f} s)"))


def parity(gguf: Path, rows: list[tuple[str, str]]) -> None:
    from transformers import AutoModelForCausalLM

    reference = (
        AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
        .cuda()
        .eval()
    )
    from core import SamplingParams

    params = SamplingParams(max_tokens=PARITY_TOKENS, temperature=0, ignore_eos=True)
    for backend in ("flash", "torch_ref"):
        options = dict(quantization="none", dtype="float32", attention_backend=backend)
        with engine(gguf, enforce_eager=True, **options) as llm:
            outputs = llm.generate(PARITY_PROMPTS, params)
        verdicts = [
            _compare(reference, list(o.prompt_token_ids), list(o.outputs[0].token_ids))
            for o in outputs
        ]
        rows.append((f"greedy parity core[{backend}] vs transformers (fp32)", "; ".join(verdicts)))


@torch.no_grad()
def _compare(reference: Any, prompt: list[int], ours: list[int]) -> str:
    tokens = torch.tensor([prompt], device="cuda")
    theirs = reference.generate(tokens, max_new_tokens=len(ours), do_sample=False,
                                min_new_tokens=len(ours))[0, len(prompt):].tolist()  # fmt: skip
    for i, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        if a != b:
            logits = reference(torch.tensor([prompt + theirs[:i]], device="cuda")).logits[0, -1]
            top2 = logits.topk(2).values
            gap, scale = float(top2[0] - top2[1]), float(logits.abs().max())
            tie = "near-tie" if gap < NEAR_TIE * scale else "NOT a near-tie"
            return f"diverges at {i} ({tie}, gap {gap:.2g})"
    return "identical"


def levels(gguf: Path, sizes: Sizes, rows: list[tuple[str, str]]) -> dict[int, dict]:
    from core.tokenizer import Tokenizer

    prompts = w1_prompts(Tokenizer.from_gguf(gguf), sizes)
    results = {}
    with tempfile.TemporaryDirectory() as cache:
        for level in (0, 1, 2):
            start = time.perf_counter()
            options = dict(quantization="none", dtype="bfloat16", optimization_level=level)
            with engine(gguf, compilation_config={"cache_dir": cache}, **options) as llm:
                startup = time.perf_counter() - start
                graphs = llm.engine.core.executor.worker.runner.graphs
                results[level] = {"W1": core_w1(llm, prompts, sizes), "W2": core_w2(llm, sizes)}
            w1, w2 = results[level]["W1"], results[level]["W2"]
            capture = "" if graphs is None else f", graph capture {graphs.capture_seconds:.1f} s"
            rows.append((
                f"-O{level} (bf16)",
                f"W1 {w1['output_tokens_per_s']:.0f} out tok/s; W2 TTFT {w2['ttft_ms']:.1f} ms, "
                f"TPOT {w2['tpot_ms']:.2f} ms; startup {startup:.0f} s{capture}",
            ))  # fmt: skip
    return results


def hbm_bound(gguf: Path, results: dict[int, dict], rows: list[tuple[str, str]]) -> None:
    bandwidth = _copy_bandwidth()
    with engine(gguf, quantization="none", dtype="bfloat16", enforce_eager=True) as llm:
        weight_bytes = _weight_bytes(llm)
    bound = bandwidth / weight_bytes
    for level, result in results.items():
        decode = result["W2"]["decode_tokens_per_s"]
        rows.append((
            f"-O{level} W2 decode vs HBM bound",
            f"{decode:.0f} tok/s of {bound:.0f} ({decode / bound:.0%}); copy bandwidth "
            f"{bandwidth / 1e9:.0f} GB/s, weights {weight_bytes / 2**20:.0f} MiB",
        ))  # fmt: skip


def _copy_bandwidth(num_bytes: int = 2 << 30, repeats: int = 10) -> float:
    """Bytes moved per second (read + write) by a device-to-device copy."""
    src = torch.empty(num_bytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        dst.copy_(src)
    torch.cuda.synchronize()
    return 2 * num_bytes * repeats / (time.perf_counter() - start)


def _weight_bytes(llm: Any) -> int:
    """The bytes one decode step reads: every parameter of the in-process engine's model."""
    model = llm.engine.core.executor.worker.model
    return sum(p.numel() * p.element_size() for p in model.parameters())


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check")
    parser.add_argument("--quick", action="store_true", help="QUICK workload sizes")
    parser.add_argument("--skip-kit", action="store_true", help="skip the conformance kit")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("gpu_check: no CUDA/ROCm GPU visible to torch; nothing to check")
    gguf = default_model_path()
    rows = [("device", f"{torch.cuda.get_device_name()}, torch {torch.__version__}")]
    checks = [] if args.skip_kit else [lambda: kit(rows)]
    checks.append(lambda: parity(gguf, rows))
    for check in checks:
        check()
    results = levels(gguf, QUICK if args.quick else FULL, rows)
    hbm_bound(gguf, results, rows)
    print("| check | result |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")


if __name__ == "__main__":
    main(sys.argv[1:])
