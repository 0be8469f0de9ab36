"""The CPU platform's defaults follow what the CPU can do fast."""

from __future__ import annotations

import pytest
import torch

from core.platforms import cpu
from core.platforms.cpu import CpuPlatform


@pytest.mark.parametrize(
    ("flags", "dtype"),
    [({"avx512f", "amx_tile", "amx_bf16"}, torch.bfloat16), ({"avx2", "fma"}, torch.float32)],
)
def test_bfloat16_is_the_default_only_with_amx(monkeypatch, flags, dtype):
    monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset(flags))
    assert CpuPlatform().default_dtype == dtype


def test_cpuinfo_reads_the_first_processors_fields():
    fields = cpu.cpuinfo()
    if not fields:
        pytest.skip("no /proc/cpuinfo on this system")
    assert "flags" in fields and cpu.cpu_flags() == frozenset(fields["flags"].split())
