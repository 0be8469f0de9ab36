"""Core's W1 and W2 on one engine, and the benchmark run's log: shared by the run
(`python -m benchmarks`) and the child processes it runs an engine in (a function of
`__main__` is not found by name in a spawned child)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks import step_anatomy, workloads
from benchmarks.workloads import Prompts, Sizes


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def timed(label: str, fn: Callable[..., Any], *fn_args: Any) -> Any:
    log(f"{label} ...")
    start = time.perf_counter()
    value = fn(*fn_args)
    log(f"{label} done in {time.perf_counter() - start:.0f} s")
    return value


def core_offline(
    engine: str,
    selected: Sequence[str],
    sizes: Sizes,
    w1: Prompts,
    model: Path,
    **engine_args: Any,
) -> dict:
    """W1 and W2 on one engine of `model` (`engine_args` for `LLM`), dropped on return
    (before W4 loads its own), and under "load" its load time and dtype. W1's prompts
    (`w1`) are token ids of the GGUF's tokenizer, which the AWQ checkpoint carries over
    unchanged."""
    found: dict = {}
    if not {"W1", "W2"} & set(selected):
        return found
    start = time.perf_counter()
    llm = workloads.load_core(model, **engine_args)
    found["load"] = {"llm_s": time.perf_counter() - start, "dtype": workloads.engine_dtype(llm)}
    try:
        if "W1" in selected:
            found["W1"] = timed(f"{engine} W1", workloads.core_w1, llm, w1, sizes)
            found["W1"]["step_anatomy"] = timed(f"{engine} step anatomy", step_anatomy.measure,
                                                llm)  # fmt: skip
        if "W2" in selected:
            found["W2"] = timed(f"{engine} W2", workloads.core_w2, llm, sizes)
    finally:
        llm.engine.shutdown()
    return found


def core_offline_in_child(
    threads: int, *args: Any, environment: dict[str, str] | None = None, **engine_args: Any
) -> dict:
    """`core_offline` in a spawned child, with the run's thread count and `environment`
    added to the child's variables."""
    torch.set_num_threads(threads)
    os.environ.update(environment or {})
    return core_offline(*args, **engine_args)
