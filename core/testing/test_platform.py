"""Conformance of a platform (`--core-conformance=platform:NAME`).

The probe (the entry point's value) is loaded and called in a fresh interpreter, which
must not import any of HEAVY_MODULES on the way, and answers with the dotted path of a
Platform subclass, None, or `core.platforms.Unavailable(reason)`; any other exception
breaks the contract. When it answers with a path, the class imports, subclasses
Platform, constructs without arguments and keeps the Platform contract: identity
attributes, dtypes, preferred components that are installed, positive memory figures, a
peak-memory counter that sees an allocation (platforms that profile memory), graphs that
replay on new inputs (platforms offering -O2), a usable
torch device, and a plain start (EngineArgs with no option) that it accepts. When
it does not, the class checks are skipped with the probe's reason.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import warnings
from typing import Any

import pytest
import torch

from core.config import GRAPH_CAPTURE_LEVEL, UsageContext
from core.engine_args import EngineArgs
from core.platforms.interface import Platform
from core.plugins import get_registry
from core.plugins.groups import ATTENTION_BACKENDS, SAMPLERS
from core.testing.plugin import targets_of
from core.testing.targets import Target

HEAVY_MODULES = frozenset({"torch", "triton", "jax", "tensorflow", "cupy", "pycuda", "numba"})
"""Top-level modules a probe must not import: ML frameworks and device runtimes, which
take seconds to import and may initialise a device. (numpy is allowed.)"""


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    params = [pytest.param(t, id=t.id) for t in targets_of(metafunc.config, "platform")]
    metafunc.parametrize("target", params, scope="module")


@pytest.fixture(scope="module")
def probe_report(target: Target) -> dict[str, Any]:
    """What the probe did in a fresh interpreter (see core.testing.probe_child)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    command = [sys.executable, "-m", "core.testing.probe_child", target.spec.name]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    if done.returncode != 0:
        pytest.fail(f"loading the probe failed:\n{done.stderr[-3000:]}", pytrace=False)
    return json.loads(done.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def platform(probe_report: dict[str, Any]) -> Platform:
    """An instance of the class the probe named; skips when the probe found none."""
    path = probe_report.get("path")
    if path is None:
        why = probe_report.get("unavailable") or probe_report.get("error") or "returned None"
        pytest.skip(f"the platform is unavailable here: {why}")
    module_name, _, class_name = path.rpartition(".")
    cls = getattr(importlib.import_module(module_name), class_name)
    if not (isinstance(cls, type) and issubclass(cls, Platform)):
        pytest.fail(f"{path} is not a Platform subclass", pytrace=False)
    return cls()


def test_probe_imports_nothing_heavy(probe_report: dict[str, Any]) -> None:
    heavy = sorted({m.split(".")[0] for m in probe_report["modules"]} & HEAVY_MODULES)
    assert not heavy, f"loading and calling the probe imported {heavy}"


def test_probe_answers_with_a_path_none_or_unavailable(probe_report: dict[str, Any]) -> None:
    assert "error" not in probe_report, (
        f"the probe raised {probe_report.get('error')}; raise core.platforms.Unavailable"
        "(reason) or return None when the platform cannot run here"
    )
    path = probe_report.get("path")
    if path is not None:
        assert isinstance(path, str) and "." in path, f"{path!r} is not a dotted class path"
    reason = probe_report.get("unavailable")
    if "unavailable" in probe_report:
        assert isinstance(reason, str) and reason, "Unavailable was raised without a reason"


def test_identity_attributes_are_named(platform: Platform) -> None:
    for attribute in ("name", "device_type", "device_name", "dist_backend"):
        value = getattr(platform, attribute)
        assert isinstance(value, str) and value, f"{attribute} = {value!r}"


def test_dtypes_are_declared_and_the_default_is_one_of_them(platform: Platform) -> None:
    dtypes = platform.supported_dtypes
    assert dtypes and all(isinstance(d, torch.dtype) for d in dtypes), f"{dtypes!r}"
    assert platform.default_dtype in dtypes


def test_preferred_components_are_installed(platform: Platform) -> None:
    """At least one preferred attention backend, and the preferred sampler, are
    installed; preferences that are not (optional plugins) are reported as warnings."""
    registry = get_registry()
    backends = platform.preferred_attention_backends
    missing = [n for n in backends if registry.get(ATTENTION_BACKENDS, n) is None]
    assert len(missing) < len(backends), f"no preferred attention backend is installed: {backends}"
    if missing:
        warnings.warn(f"preferred attention backends not installed: {missing}", stacklevel=1)
    assert registry.get(SAMPLERS, platform.preferred_sampler) is not None, (
        f"preferred sampler {platform.preferred_sampler!r} is not installed"
    )


def test_memory_info_is_positive(platform: Platform) -> None:
    memory = platform.memory_info()
    assert 0 < memory.available_bytes <= memory.total_bytes, f"{memory}"


def test_peak_memory_sees_an_allocation(platform: Platform) -> None:
    """A platform that sizes the KV cache by profiling measures its device: a tensor
    allocated after reset_peak_memory raises peak_memory_bytes by at least its size."""
    if not platform.memory_profiling:
        pytest.skip("the platform does not profile memory")
    device = platform.torch_device(0)
    platform.set_device(device)
    platform.reset_peak_memory()
    before = platform.peak_memory_bytes()
    block = torch.ones(64 << 20, dtype=torch.uint8, device=device)
    assert platform.peak_memory_bytes() >= before + block.numel()


def test_a_captured_graph_replays_on_new_inputs(platform: Platform) -> None:
    """A platform offering -O2 records a call into a DeviceGraph whose replay recomputes
    `output` from what the captured input tensor holds at replay time."""
    if GRAPH_CAPTURE_LEVEL not in platform.supported_optimization_levels:
        pytest.skip("the platform does not capture graphs (no -O2)")
    device = platform.torch_device(0)
    platform.set_device(device)
    static = torch.arange(4.0, device=device)
    graph = platform.capture_graph(lambda: static * 2 + 1)
    static.copy_(torch.tensor([10.0, 20.0, 30.0, 40.0]))
    graph.replay()
    assert graph.output.cpu().tolist() == [21.0, 41.0, 61.0, 81.0]


def test_torch_device_holds_tensors(platform: Platform) -> None:
    device = platform.torch_device(0)
    assert device.type == platform.device_type
    assert torch.ones(2, device=device).sum().item() == 2


def test_token_budgets_are_positive(platform: Platform) -> None:
    for usage in UsageContext:
        budget = platform.default_max_num_batched_tokens(usage)
        assert isinstance(budget, int) and budget > 0, f"{usage.value}: {budget!r}"


def test_burst_budgets_are_none_or_at_least_the_step_budget(platform: Platform) -> None:
    for usage in UsageContext:
        burst = platform.default_burst_token_budget(usage)
        budget = platform.default_max_num_batched_tokens(usage)
        assert burst is None or (isinstance(burst, int) and burst >= budget), (
            f"{usage.value}: burst {burst!r} under the step budget {budget}"
        )


def test_a_plain_start_is_accepted(platform: Platform) -> None:
    EngineArgs().create_engine_config(platform)
