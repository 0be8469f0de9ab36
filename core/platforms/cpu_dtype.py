"""The CPU platform's default dtype, chosen by measurement and cached per CPU model.

bfloat16 is a candidate only where the CPU has a native bf16 dot product (AMX or
AVX512_BF16): elsewhere torch's bf16 matmuls are several to hundreds of times slower than
fp32 GEMM, so float32 is chosen without measuring. Where it is a candidate, a probe of
about a second times a small decoder's linear layers (the work that dominates a step) in
both dtypes, and bfloat16 wins only when it is clearly faster: a flag says the CPU *can*
multiply bf16, not that torch's kernels on it are fast. The decision is cached in a JSON
file so the probe runs once per CPU model, torch version and thread count, not at every
start (delete the file to measure again).
"""

from __future__ import annotations

import functools
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from core import measurement_cache
from core.ops import linear
from core.plugins.registry import get_registry

logger = logging.getLogger(__name__)

# The /proc/cpuinfo flags of a native bf16 dot product (AMX tiles, AVX512_BF16's vdpbf16ps).
CANDIDATE_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})
# (in_features, out_features) of SmolLM2-135M's decoder-layer linears: fused QKV, fused
# gate/up, down; and of its LM head, the largest single matmul of a decode step.
LAYER_SHAPES = ((576, 960), (576, 3072), (1536, 576))
HEAD_SHAPE = (576, 49152)
# Rows per matmul: decode-like (one and 16 sequences) and a prefill-like chunk. The head
# sees only decode-like rows: a prefill computes logits for its last token alone.
DECODE_ROWS = (1, 16)
PREFILL_ROWS = 128
PROBE_CASES = tuple(
    sorted(
        [(rows, shape) for rows in (*DECODE_ROWS, PREFILL_ROWS) for shape in LAYER_SHAPES]
        + [(rows, HEAD_SHAPE) for rows in DECODE_ROWS],
        key=lambda case: case[0] * case[1][0] * case[1][1],  # cheapest first
    )
)
NUM_REPEATS = 5
# bfloat16 wins when its total time is at most this share of float32's: a margin for
# noise, since a wrong bf16 choice also costs accuracy.
BF16_WIN_RATIO = 0.9
# Stop measuring once bfloat16 is this many times slower (and float32 has run long enough
# for the ratio to mean something): the large shapes would take seconds each.
HOPELESS_RATIO = 5.0
HOPELESS_MIN_FLOAT32_S = 1e-3
# Measuring stops after the case that crosses this wall-clock budget.
PROBE_BUDGET_S = 2.0
CACHE_FILE_NAME = "cpu_dtype.json"
_DTYPE_NAMES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class ProbeTimes:
    """Summed best-of-`NUM_REPEATS` times of the linear layers the probe measured."""

    float32_s: float
    bfloat16_s: float
    num_cases: int  # fewer than len(PROBE_CASES) when the probe stopped early


@dataclass(frozen=True)
class DtypeChoice:
    """The default dtype and why, as `core info` and the engine's start log say it."""

    dtype: torch.dtype
    reason: str
    times: ProbeTimes | None = None


def probe_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The linear layer the probe times, the one the model's layers call: `core::linear`,
    served by whichever kernel a plugin registered for the CPU (see measure_linear_times)."""
    return linear(x, weight)


@functools.cache
def choose_cpu_dtype(model_name: str, flags: frozenset[str], num_threads: int) -> DtypeChoice:
    """float32 without a candidate flag; else the cached decision for this CPU, or a fresh
    measurement (saved for the next start). Runs at most once per process and key."""
    candidates = "+".join(sorted(flags & CANDIDATE_FLAGS))
    if not candidates:
        return DtypeChoice(torch.float32, "no AMX or AVX512_BF16")
    key = f"{model_name} | {candidates} | torch {torch.__version__} | {num_threads} threads"
    path = measurement_cache.cache_path(CACHE_FILE_NAME)
    entries = measurement_cache.load_entries(path)
    cached = _choice_from_record(entries.get(key), path)
    if cached is not None:
        return DtypeChoice(cached.dtype, f"{cached.reason}; cached in {path}", cached.times)
    times = measure_linear_times()
    choice = decide(times, candidates)
    saved = measurement_cache.save_entries(path, {**entries, key: _record(choice, times)})
    where = f"saved to {path}" if saved else "not cached"
    return DtypeChoice(choice.dtype, f"{choice.reason}; measured now, {where}", choice.times)


def decide(times: ProbeTimes, candidates: str) -> DtypeChoice:
    """bfloat16 when it took at most `BF16_WIN_RATIO` of float32's time, else float32."""
    speedup = times.float32_s / times.bfloat16_s
    measured = _speedup_words(speedup)
    total = len(PROBE_CASES)
    if times.num_cases < total:
        measured += f" (probe stopped after {times.num_cases} of {total} matmuls)"
    if times.bfloat16_s <= BF16_WIN_RATIO * times.float32_s:
        return DtypeChoice(torch.bfloat16, f"{candidates}; {measured}", times)
    needed = f"bfloat16 needs {1 / BF16_WIN_RATIO:.2f}x"
    return DtypeChoice(torch.float32, f"{candidates}, but {measured}; {needed}", times)


def _speedup_words(speedup: float) -> str:
    if speedup >= 1:
        return f"bfloat16 measured {speedup:.2f}x faster than float32"
    return f"bfloat16 measured {1 / speedup:.2f}x slower than float32"


def measure_linear_times(budget_s: float = PROBE_BUDGET_S) -> ProbeTimes:
    """Time `probe_linear` over PROBE_CASES in float32 and bfloat16, cheapest first,
    stopping early when bfloat16 is hopeless or `budget_s` has passed."""
    # The kernels that will serve the model are the ones to time: plugins register them
    # from their `core.general` entry points (re-entrant; a process running a model calls
    # them anyway).
    get_registry().run_general_plugins()
    # A private generator: the probe must not move the user's (or the engine's) RNG.
    generator = torch.Generator().manual_seed(0)
    float32_s = bfloat16_s = 0.0
    num_cases = 0
    start = time.perf_counter()
    for rows, (in_features, out_features) in PROBE_CASES:
        # A matmul's time does not depend on the values (none are subnormal), and filling
        # is far cheaper than drawing random numbers for the 28M-entry head. The weights
        # are made outside inference mode, as a model's parameters are, so that they take
        # the kernels a model's take (a plugin may keep packed copies of normal tensors).
        weight = torch.full((out_features, in_features), 1 / in_features)  # [out, in]
        x = torch.rand(rows, in_features, generator=generator)  # [rows, in]
        weight_bf16 = weight.bfloat16()
        with torch.inference_mode():
            float32_s += _best_time(x, weight)
            bfloat16_s += _best_time(x.bfloat16(), weight_bf16)
        num_cases += 1
        if _should_stop(float32_s, bfloat16_s, time.perf_counter() - start, budget_s):
            break
    return ProbeTimes(float32_s, bfloat16_s, num_cases)


def _best_time(x: torch.Tensor, weight: torch.Tensor) -> float:
    """The fastest of NUM_REPEATS calls, after one untimed call (kernel set-up, caches)."""
    probe_linear(x, weight)
    best = math.inf
    for _ in range(NUM_REPEATS):
        start = time.perf_counter()
        probe_linear(x, weight)
        best = min(best, time.perf_counter() - start)
    return best


def _should_stop(float32_s: float, bfloat16_s: float, elapsed_s: float, budget_s: float) -> bool:
    hopeless = bfloat16_s > HOPELESS_RATIO * float32_s and float32_s >= HOPELESS_MIN_FLOAT32_S
    return hopeless or elapsed_s > budget_s


def _record(choice: DtypeChoice, times: ProbeTimes) -> dict[str, Any]:
    """The JSON form of a measured choice (its reason without where it was cached)."""
    return {
        "dtype": str(choice.dtype).removeprefix("torch."),
        "reason": choice.reason,
        "float32_s": times.float32_s,
        "bfloat16_s": times.bfloat16_s,
        "num_cases": times.num_cases,
    }


def _choice_from_record(record: object, path: Path) -> DtypeChoice | None:
    """The cached choice; None when there is no record, or (with a warning) a malformed one."""
    if record is None:
        return None
    try:
        return _parse_record(record)
    except (KeyError, TypeError, ValueError) as exc:
        logger.warning("ignoring a malformed entry of %s (%r); measuring again", path, exc)
        return None


def _parse_record(record: object) -> DtypeChoice:
    """The choice `_record` wrote; KeyError, TypeError or ValueError for anything else."""
    if not isinstance(record, dict) or not isinstance(record.get("reason"), str):
        raise TypeError("a record is a JSON object with a string reason")
    num_cases = record["num_cases"]
    if not isinstance(num_cases, int) or num_cases < 1:
        raise ValueError(f"num_cases must be a positive integer, not {num_cases!r}")
    times = ProbeTimes(_seconds(record["float32_s"]), _seconds(record["bfloat16_s"]), num_cases)
    return DtypeChoice(_DTYPE_NAMES[record["dtype"]], record["reason"], times)


def _seconds(value: object) -> float:
    if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"a time must be a positive number of seconds, not {value!r}")
    return float(value)
