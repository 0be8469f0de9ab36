"""The CPU platform's defaults follow what the CPU can do fast."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from core.engine_args import EngineArgs
from core.platforms import cpu
from core.platforms.cpu import CpuPlatform

TWO_PROCESSORS = """\
processor\t: 0
model name\t: Test CPU
flags\t\t: fpu sse2 avx2

processor\t: 1
model name\t: Test CPU
flags\t\t: fpu sse2 avx2 amx_bf16
"""


@pytest.fixture
def fresh_cpuinfo():
    cpu.cpuinfo.cache_clear()
    yield
    cpu.cpuinfo.cache_clear()


def test_cpuinfo_reads_only_the_first_processors_fields(monkeypatch, fresh_cpuinfo):
    monkeypatch.setattr(cpu, "open", lambda path: io.StringIO(TWO_PROCESSORS), raising=False)
    assert cpu.cpuinfo() == {"processor": "0", "model name": "Test CPU", "flags": "fpu sse2 avx2"}
    assert cpu.cpu_flags() == frozenset({"fpu", "sse2", "avx2"})


def test_cpu_flags_match_this_machines_first_flags_line(fresh_cpuinfo):
    path = Path("/proc/cpuinfo")
    if not path.exists():
        pytest.skip("no /proc/cpuinfo on this system")
    first = re.search(r"^flags\s*:(.*)$", path.read_text(), re.MULTILINE)
    if first is None:
        pytest.skip("this system's /proc/cpuinfo lists no flags")
    assert cpu.cpu_flags() == frozenset(first.group(1).split())


def test_cpu_runs_eager_by_default_compiles_at_o1_and_refuses_graph_capture():
    config = EngineArgs().create_engine_config(CpuPlatform())
    assert (config.compilation.level, config.compilation.compile_model) == (0, False)
    assert config.compilation.capture_graphs is False
    compiled = EngineArgs(optimization_level=1).create_engine_config(CpuPlatform()).compilation
    assert (compiled.compile_model, compiled.capture_graphs) == (True, False)
    with pytest.raises(ValueError, match="^-O2 needs a platform with graph capture; the cpu "):
        EngineArgs(optimization_level=2).create_engine_config(CpuPlatform())
    with pytest.raises(ValueError, match="-O3 is reserved .*the cpu platform supports -O0, -O1$"):
        EngineArgs(optimization_level=3).create_engine_config(CpuPlatform())
