"""-O1 on the CPU: does torch.compile (inductor's C++ code) beat eager, and what does it
cost at startup?

    python -m benchmarks.compile [--quick] [--threads 2]

W1 and W2 (benchmarks/README.md) on the default model at -O0 and at -O1, in one process,
one engine at a time, float32 weights (`--quantization none`, the float baseline) and the
platform's default dtype; then the cold start of `core serve` (process start to the first
/health 200) at -O0, at -O1 with an empty compile cache and at -O1 with the cache the
previous start left. Prints one table; the -O1 / -O0 ratios decide the CPU platform's
default level (DESIGN.md section 6: -O1 only if it wins and starts within 30 s cold and
10 s warm).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.workloads import (
    FULL,
    QUICK,
    core_serve_command,
    core_w1,
    core_w2,
    free_port,
    load_core,
    server_process,
    thread_env,
    w1_prompts,
)
from core.model_loader.resolve import default_model_path

COLD_START_BUDGET_S = 30.0
WARM_START_BUDGET_S = 10.0


def offline(gguf: Path, level: int, sizes, prompts) -> dict:
    llm = load_core(gguf, quantization="none", optimization_level=level)
    try:
        return {"W1": core_w1(llm, prompts, sizes), "W2": core_w2(llm, sizes)}
    finally:
        llm.engine.shutdown()


def cold_start(gguf: Path, level: int, cache_dir: Path, threads: int) -> float:
    """Seconds from launching `core serve` to its first healthy /health."""
    port = free_port()
    command = core_serve_command(gguf, port) + ["-O", str(level), "--quantization", "none"]
    env = {**thread_env(threads), "CORE_CACHE_DIR": str(cache_dir)}
    start = time.perf_counter()
    with server_process(command, f"http://127.0.0.1:{port}", env):
        return time.perf_counter() - start


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compile")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    gguf = default_model_path()
    from core.tokenizer import Tokenizer

    prompts = w1_prompts(Tokenizer.from_gguf(gguf), sizes)
    runs = {level: offline(gguf, level, sizes, prompts) for level in (0, 1)}
    with tempfile.TemporaryDirectory() as cache:
        starts = {
            "-O0": cold_start(gguf, 0, Path(cache), args.threads),
            "-O1, empty compile cache": cold_start(gguf, 1, Path(cache), args.threads),
            "-O1, warm compile cache": cold_start(gguf, 1, Path(cache), args.threads),
        }
    print(report(runs, starts))


def report(runs: dict[int, dict], starts: dict[str, float]) -> str:
    w1 = {level: run["W1"]["output_tokens_per_s"] for level, run in runs.items()}
    tpot = {level: run["W2"]["tpot_ms"] for level, run in runs.items()}
    ttft = {level: run["W2"]["ttft_ms"] for level, run in runs.items()}
    lines = [
        "| figure | -O0 | -O1 | -O1 / -O0 |",
        "|---|---|---|---|",
        f"| W1 output tok/s | {w1[0]:.1f} | {w1[1]:.1f} | {w1[1] / w1[0]:.2f}x |",
        f"| W2 TTFT ms (median) | {ttft[0]:.1f} | {ttft[1]:.1f} | {ttft[1] / ttft[0]:.2f}x |",
        f"| W2 TPOT ms (median) | {tpot[0]:.1f} | {tpot[1]:.1f} | {tpot[1] / tpot[0]:.2f}x |",
        "",
        "| core serve start to /health | seconds | budget |",
        "|---|---|---|",
    ]
    budgets = {"-O1, empty compile cache": COLD_START_BUDGET_S}
    budgets["-O1, warm compile cache"] = WARM_START_BUDGET_S
    for name, seconds in starts.items():
        budget = budgets.get(name)
        lines.append(f"| {name} | {seconds:.1f} | {'' if budget is None else f'{budget:.0f}'} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1:])
