"""Without its C++ extension, core-cpu-kernels serves nothing and core runs on its
references: the plugin is reported failed with the reason (a logged warning), and the
engine generates the greedy tokens it generates with the kernels (DESIGN.md's
determinism rule).

Hiding is `sys.modules["core_cpu_kernels._C"] = None` before anything is imported, so
`from core_cpu_kernels import _C` raises ImportError, as where the extension failed to
build or to load.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from determinism import assert_greedy_equivalent

from core.testing.tiny_checkpoint import reference_model, write_tiny_checkpoint

pytest.importorskip("core_cpu_kernels.ops", reason="core-cpu-kernels is not installed")

RUN = Path(__file__).with_name("hidden_extension_run.py")
KERNEL_OPS = ["fused_add_rms_norm", "quant_linear", "rms_norm", "rotary_embedding", "silu_and_mul"]
HIDDEN = "import of core_cpu_kernels._C halted; None in sys.modules"
# Runs the general plugins in a fresh process with the extension hidden; prints who serves
# each op on the CPU and the plugin entry's state.
GENERAL_PLUGINS_HIDDEN = """
import json, sys
sys.modules["core_cpu_kernels._C"] = None
from core.ops import CORE_OPS
from core.plugins import get_registry
registry = get_registry()
registry.run_general_plugins()
entry = registry.get("core.general", "kernel_ops")
served = {name: CORE_OPS.provider(name, "cpu") for name in CORE_OPS.providers()}
print(json.dumps({"providers": served, "state": entry.state.value, "reason": entry.reason}))
"""


def test_general_plugins_without_the_extension_leave_the_ops_to_the_references():
    done = subprocess.run(
        [sys.executable, "-c", GENERAL_PLUGINS_HIDDEN], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert {name: result["providers"][name] for name in KERNEL_OPS} == dict.fromkeys(KERNEL_OPS)
    assert result["state"] == "failed" and HIDDEN in result["reason"]
    warning = "plugin kernel_ops from distribution core-cpu-kernels (group core.general) failed"
    assert f"{warning}: import failed: ModuleNotFoundError: {HIDDEN}" in done.stderr


def _start(checkpoint: Path, mode: str) -> subprocess.Popen:
    command = [sys.executable, str(RUN), str(checkpoint), mode]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(process: subprocess.Popen) -> tuple[dict, str]:
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr[-3000:]
    return json.loads(stdout.strip().splitlines()[-1]), stderr


@pytest.fixture(scope="module")
def engine_runs(tmp_path_factory) -> tuple[dict, dict, str]:
    """(with the kernels, with the extension hidden, the hidden run's stderr): the two
    engine processes run side by side."""
    checkpoint = write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))
    kept, hidden = _start(checkpoint, "keep"), _start(checkpoint, "hide")
    (with_kernels, _), (without, stderr) = _result(kept), _result(hidden)
    return with_kernels, without, stderr


@pytest.mark.slow  # two engine processes: about 10 s on 2 busy cores
def test_the_engine_on_the_references_generates_the_greedy_tokens_of_the_kernels(engine_runs):
    with_kernels, without, stderr = engine_runs
    assert with_kernels["kernel_ops"]["state"] == "loaded"
    assert {name: with_kernels["providers"][name] for name in KERNEL_OPS} == dict.fromkeys(
        KERNEL_OPS, "core-cpu-kernels"
    )
    assert {name: without["providers"][name] for name in KERNEL_OPS} == dict.fromkeys(KERNEL_OPS)
    assert without["kernel_ops"]["state"] == "failed" and HIDDEN in stderr
    reference = reference_model()

    def logits(tokens: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return reference(torch.tensor([tokens])).logits[0, -1]

    for prompt, ours, theirs in zip(
        without["prompts"], without["tokens"], with_kernels["tokens"], strict=True
    ):
        assert_greedy_equivalent(ours, theirs, logits, prompt, label=f"prompt {prompt}")
