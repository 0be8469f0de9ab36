"""Fixtures of core-cpu-kernels' tests."""

from __future__ import annotations

import subprocess
import sys

import pytest

from core.kernel_choice import KernelChoices


@pytest.fixture
def choices(monkeypatch) -> KernelChoices:
    """Kernel choices of this test alone, holding this package's candidates: a problem's
    kernel stays chosen once looked up, so a choice forced in one test would leak."""
    candidates = pytest.importorskip("core_cpu_kernels.candidates")
    ops = pytest.importorskip("core_cpu_kernels.ops")
    backend = pytest.importorskip("core_cpu_kernels.backend")
    fresh = KernelChoices()
    for module in (candidates, ops, backend):
        monkeypatch.setattr(module, "KERNEL_CHOICES", fresh)
    monkeypatch.delenv("CORE_KERNEL_CHOICE", raising=False)
    monkeypatch.delenv("CORE_CPU_INT8_ACTIVATIONS", raising=False)
    candidates.register()
    return fresh


@pytest.fixture(scope="session")
def core_info() -> str:
    """What `core info` prints in a fresh process (the plugins' entries run there)."""
    script = "from core.entrypoints.cli import main; main()"
    result = subprocess.run(
        [sys.executable, "-c", script, "info"], capture_output=True, text=True, check=True
    )
    return result.stdout
