"""The `core` command line: plugins, info, and commands not available yet."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner
from plugin_sources import API, available_platform, platform_plugin

from core import kernel_choice
from core.entrypoints.cli import cli
from core.entrypoints.reports import hooks_report
from core.kernel_choice import KernelCandidate, KernelChoices
from core.plugins import PluginRegistry, hookspecs
from core.plugins.groups import ATTENTION_BACKENDS, HOOKS, PLATFORMS
from core.testing.tiny_checkpoint import write_tiny_checkpoint

PLUGIN_DISTRIBUTIONS = (
    "core-cuda",
    "core-rocm",
    "core-attn-flash",
    "core-quant-awq",
    "core-lora",
    "core-spec-decode",
    "core-kv-connectors",
    "core-moe-triton",
    "core-quant-triton",
)

HOOKS_PLUGIN = {
    "acme_hooks/__init__.py": API,
    "acme_hooks/impl.py": """
        import click
        from core.plugins import hookimpl

        @hookimpl
        def core_add_commands(cli):
            @click.command(name="acme-hello")
            def hello():
                click.echo("hello from acme")
            cli.add_command(hello)
    """,
}


def run_core(*args: str, site=None, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, **env}
    if site is not None:
        environ["PYTHONPATH"] = os.pathsep.join([str(site.root), environ.get("PYTHONPATH", "")])
    script = [sys.executable, "-c", "from core.entrypoints.cli import main; main()"]
    return subprocess.run([*script, *args], capture_output=True, text=True, env=environ)


def invoke(*args: str, **env: str):
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def test_version():
    result = invoke("--version")
    assert result.exit_code == 0 and "0.1.0" in result.output


def test_info_selects_an_available_third_party_platform(site):
    site.add("acme-platform", {PLATFORMS: {"acme": "acme_platform.probe:probe"}},
             available_platform("acme_platform", "AcmePlatform"))  # fmt: skip
    result = run_core("info", site=site)
    assert result.returncode == 0, result.stderr
    assert "platform: acme (AcmePlatform device)" in result.stdout
    assert "the only available accelerator platform" in result.stdout


def test_info_survives_a_plugin_that_fails_to_import(site, fresh_registry):
    modules = {"broken_plugin/__init__.py": API,
               "broken_plugin/probe.py": "raise ImportError('libacme.so not found')\n"}  # fmt: skip
    site.add("broken-plugin", {PLATFORMS: {"broken": "broken_plugin.probe:probe"}}, modules)
    result = invoke("info")
    assert result.exit_code == 0
    assert "platform: cpu" in result.output
    assert "rejected broken: failed: import failed: ImportError: libacme.so" in result.output
    plugins = invoke("plugins")
    assert "broken-plugin" in plugins.output
    assert "failed: import failed: ImportError: libacme.so not found" in plugins.output


def test_info_shows_an_unavailable_reason(site, fresh_registry):
    site.add("sleepy", {PLATFORMS: {"sleepy": "sleepy.probe:probe"}},
             platform_plugin("sleepy", "Sleepy", 'raise Unavailable("no device")'))  # fmt: skip
    result = invoke("info")
    assert "rejected sleepy: unavailable: no device" in result.output


def test_two_available_platforms_are_an_error_until_one_is_chosen(site, fresh_registry):
    for package, cls in (("acme_platform", "AcmePlatform"), ("zeta_platform", "ZetaPlatform")):
        name = package.split("_")[0]
        site.add(f"{name}-platform", {PLATFORMS: {name: f"{package}.probe:probe"}},
                 available_platform(package, cls))  # fmt: skip
    result = invoke("info", CORE_PLATFORM="")
    assert "several platforms are available: acme, zeta" in result.output
    import core.plugins.registry as registry

    registry._registry = None
    assert "platform: zeta" in invoke("info", CORE_PLATFORM="zeta").output


def test_plugins_shows_filtered_and_refused_states(site, fresh_registry):
    site.add("acme-platform", {PLATFORMS: {"acme": "acme_platform.probe:probe"}},
             available_platform("acme_platform", "AcmePlatform"))  # fmt: skip
    modules = available_platform("future_platform", "FuturePlatform")
    modules["future_platform/__init__.py"] = 'CORE_PLUGIN_API = ">=2.0"\n'
    site.add("future-platform", {PLATFORMS: {"future": "future_platform.probe:probe"}}, modules)
    output = invoke("plugins", CORE_PLUGINS="future-platform").output
    assert "filtered: acme-platform is not in CORE_PLUGINS" in output
    assert "refused: requires core plugin API >=2.0, core provides 1.0" in output
    assert "platform: cpu" in output


def test_hook_plugins_add_commands(site):
    site.add("acme-hooks", {HOOKS: {"acme": "acme_hooks.impl"}}, HOOKS_PLUGIN)
    result = run_core("acme-hello", site=site, CORE_TRACE_PLUGINS="1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "hello from acme"
    assert "hook core_add_commands answered by ['acme-hooks:acme']" in result.stderr


def hook_rows(output: str) -> dict[str, str]:
    """{hook name: its row} of the `core plugins --hooks` table (header skipped)."""
    return {line.split()[0]: line for line in output.splitlines()[1:]}


def test_plugins_hooks_lists_every_spec_with_its_first_doc_line():
    specs = {name: fn for name, fn in vars(hookspecs).items() if name.startswith("core_")}
    rows = hook_rows(hooks_report(PluginRegistry([], allowlist=None)))
    assert set(rows) == set(specs)
    for name, fn in specs.items():
        first_line = fn.__doc__.strip().splitlines()[0]
        assert rows[name].split()[1] == "(none)" and rows[name].endswith(first_line)


def test_plugins_hooks_names_the_implementing_plugin(site, fresh_registry):
    site.add("acme-hooks", {HOOKS: {"acme": "acme_hooks.impl"}}, HOOKS_PLUGIN)
    result = invoke("plugins", "--hooks")
    assert result.exit_code == 0
    rows = hook_rows(result.output)
    assert rows["core_add_commands"].split()[1] == "acme-hooks:acme"
    assert rows["core_engine_started"].split()[1] == "(none)"


def test_plugins_lists_every_installed_plugin_distribution():
    from importlib.metadata import PackageNotFoundError, version

    try:
        versions = {name: version(name) for name in PLUGIN_DISTRIBUTIONS}
    except PackageNotFoundError as missing:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"plugin distribution {missing} is not installed here (CI installs all)")
    result = run_core("plugins")
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines()]
    for name in PLUGIN_DISTRIBUTIONS:
        row = next(r for r in rows if name in r)
        assert versions[name] in row
    assert any(r[:2] == ["core.platforms", "cuda"] and "loaded" in r for r in rows)
    info = run_core("info")
    assert "platform: cpu (CPU) — no accelerator platform is available" in info.stdout
    assert "rejected cuda: unavailable:" in info.stdout


@pytest.mark.slow
def test_generate_streams_a_completion():
    result = run_core("generate", "What is the capital of France?", "--temperature", "0",
                      "--max-tokens", "16", "--max-model-len", "1024")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout


def _quantize_options(tmp_path) -> list[str]:
    """A calibration text of the tiny checkpoint's words, and a short calibration."""
    text = tmp_path / "words.txt"
    text.write_text(" ".join(f"w{i % 45}" for i in range(0, 160, 7)))
    return ["--option", f"calibration_file={text}", "--option", "num_samples=2",
            "--option", "seq_len=8"]  # fmt: skip


def test_quantize_writes_an_awq_checkpoint(tmp_path):
    model_dir = write_tiny_checkpoint(tmp_path / "tiny")
    out_dir = tmp_path / "awq"
    result = invoke("quantize", "awq", str(model_dir), str(out_dir), "--group-size", "32",
                    *_quantize_options(tmp_path))  # fmt: skip
    assert result.exit_code == 0, result.output
    assert f"wrote {out_dir}" in result.output
    config = json.loads((out_dir / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "awq"
    assert config["quantization_config"]["group_size"] == 32
    assert (out_dir / "model.safetensors").is_file() and (out_dir / "tokenizer.json").is_file()


def test_quantize_reports_a_bad_method_option_as_an_error(tmp_path):
    model_dir = write_tiny_checkpoint(tmp_path / "tiny")
    result = invoke("quantize", "awq", str(model_dir), str(tmp_path / "awq"),
                    "--option", "group_sise=32")  # fmt: skip
    assert result.exit_code == 1
    assert "unknown AWQ options ['group_sise']" in result.output


def test_quantize_option_must_be_key_value(tmp_path):
    result = invoke("quantize", "awq", str(tmp_path / "awq"), "--option", "group_size")
    assert result.exit_code == 2
    assert "'group_size' is not KEY=VALUE" in result.output


def test_quantize_with_awq_filtered_out_names_its_distribution(tmp_path, fresh_registry):
    result = invoke("quantize", "awq", str(tmp_path / "tiny"), str(tmp_path / "awq"),
                    CORE_PLUGINS="")  # fmt: skip
    assert result.exit_code == 1
    assert "core quantize awq: " in result.output and "core-quant-awq" in result.output
    assert not (tmp_path / "awq").exists()


def test_info_says_which_quantization_methods_run_and_which_kernel_multiplies(fresh_registry):
    output = invoke("info").output
    assert "gguf (core 0.1.0): runs on cpu; keeps linear layers, embeddings and LM head" in output
    assert "gptq (core 0.1.0): runs on cpu; keeps linear layers quantized" in output
    assert "multiply via core::quant_linear: " in output
    awq = (
        "awq (core-quant-awq 0.1.0): runs on cpu"
        if _installed("core-quant-awq")
        else ("awq: not installed (pip install core-quant-awq)")
    )
    assert awq in output


def _installed(distribution: str) -> bool:
    from importlib import metadata

    try:
        metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


def test_info_prints_the_rank_layout_of_the_parallel_sizes():
    from core.entrypoints.cli import cli

    args = ["info", "--tensor-parallel-size", "2", "--pipeline-parallel-size", "2"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "rank layout: DP 1 x PP 2 x TP 2 = 4 ranks" in result.output
    assert "  rank 3: dp 0, pp 1, tp 1" in result.output
    assert "  TP groups: [[0, 1], [2, 3]]" in result.output
    assert "  PP groups: [[0, 2], [1, 3]]" in result.output


def test_info_names_the_mixture_of_experts_models_kernel_and_layouts():
    output = invoke("info").output
    assert "mixtures of experts:" in output
    architectures = next(line for line in output.splitlines() if "architectures:" in line)
    for name in ("MixtralForCausalLM", "OlmoeForCausalLM", "Qwen3MoeForCausalLM"):
        assert name in architectures
    assert "LlamaForCausalLM" not in architectures
    assert "experts via core::fused_moe on cpu: " in output
    assert "--enable-expert-parallel" in output


class _Kernel(KernelCandidate):
    provider = "core"

    def __init__(self, op: str, name: str, invariant: bool, available: bool = True) -> None:
        self.op, self.name, self.batch_invariant, self._available = op, name, invariant, available

    def available(self) -> bool:
        return self._available

    def __call__(self, *args):
        raise NotImplementedError


def _section(output: str, title: str) -> list[str]:
    """The lines of `core info`'s section `title`: its first line and the indented ones after."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    rest = lines[start + 1 :]
    return [lines[start], *itertools.takewhile(lambda line: line.startswith(" "), rest)]


@pytest.mark.parametrize(
    ("env", "state"),
    [("", "off for engines started here; --batch-invariant"), ("1", "on for engines started here")],
)
def test_info_says_whether_engines_start_in_batch_invariant_mode(env, state):
    assert f"batch-invariant mode: {state}" in invoke("info", CORE_BATCH_INVARIANT=env).output


def test_info_names_the_kernels_that_serve_batch_invariant_mode(monkeypatch, tmp_path):
    monkeypatch.setenv("CORE_CACHE_DIR", str(tmp_path))
    choices = KernelChoices()
    for kernel in (_Kernel("linear", "gemv", False), _Kernel("linear", "rowwise", True),
                   _Kernel("linear", "amx", True, available=False),
                   _Kernel("fused_moe", "grouped", False)):  # fmt: skip
        choices.register(kernel)
    monkeypatch.setattr(kernel_choice, "KERNEL_CHOICES", choices)
    section = _section(invoke("info").output, "batch-invariant mode:")
    assert section[1:4] == [
        "  kernels that serve it (the first that runs here and takes a problem, unless "
        "CORE_KERNEL_CHOICE forces another):",
        "    fused_moe: none declares it (a call in the mode fails, naming the op)",
        "    linear: rowwise, amx (not on this CPU)",
    ]


def test_info_names_the_attention_backends_that_serve_batch_invariant_mode(site, fresh_registry):
    source = """
        import dataclasses
        from core.attention.backends.torch_ref import TorchRefBackend

        class Steady(TorchRefBackend):
            name, mla_backend = "steady", None
            capabilities = dataclasses.replace(TorchRefBackend.capabilities,
                                               batch_invariant=True)

        class Swift(TorchRefBackend):
            name, mla_backend = "swift", None
            capabilities = dataclasses.replace(TorchRefBackend.capabilities,
                                               batch_invariant=False)
    """
    entries = {"steady": "steady_attn.backends:Steady", "swift": "steady_attn.backends:Swift"}
    site.add("steady-attn", {ATTENTION_BACKENDS: entries},
             {"steady_attn/__init__.py": API, "steady_attn/backends.py": source})  # fmt: skip
    section = _section(invoke("info").output, "batch-invariant mode:")
    serving = next(line for line in section if "attention backends that serve it:" in line)
    others = next(line for line in section if "attention backends that do not:" in line)
    assert "steady" in serving.split(": ")[1].split(", ")
    assert "swift" in others.split(": ")[1].split(", ")
    assert "swift" not in serving and "steady" not in others
