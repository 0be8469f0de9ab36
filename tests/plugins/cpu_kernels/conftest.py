"""Fixtures of core-cpu-kernels' tests."""

from __future__ import annotations

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
