"""Every distribution builds a wheel that carries its entry points and API declaration."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# distribution -> (source dir, import package, entry points the wheel must declare)
DISTRIBUTIONS = {
    "core": (
        ".",
        "core",
        [
            "[core.platforms]",
            "cpu = core.platforms.cpu_probe:probe",
            "core_conformance = core.testing.plugin",
        ],
    ),
    "core-cuda": ("plugins/platform_cuda", "core_cuda", ["cuda = core_cuda.probe:probe"]),
    "core-rocm": ("plugins/platform_rocm", "core_rocm", ["rocm = core_rocm.probe:probe"]),
    "core-attn-flash": (
        "plugins/attn_flash",
        "core_attn_flash",
        ["flash = core_attn_flash.backend:FlashAttentionBackend"],
    ),
    "core-quant-awq": ("plugins/quant_awq", "core_quant_awq", []),
    "core-lora": ("plugins/lora", "core_lora", []),
    "core-spec-decode": ("plugins/spec_decode", "core_spec_decode", []),
    "core-kv-connectors": (
        "plugins/kv_connectors",
        "core_kv_connectors",
        [
            "offload = core_kv_connectors.offload:OffloadConnector",
            "p2p = core_kv_connectors.p2p:P2PConnector",
            "multi = core_kv_connectors.multi:MultiConnector",
        ],
    ),
    "core-moe-triton": (
        "plugins/moe_triton",
        "core_moe_triton",
        ["moe_triton = core_moe_triton.ops:register"],
    ),
    "core-quant-triton": (
        "plugins/quant_triton",
        "core_quant_triton",
        ["quant_triton = core_quant_triton.ops:register"],
    ),
    "core-cpu-kernels": (
        "plugins/cpu_kernels",
        "core_cpu_kernels",
        ["cpu_paged = core_cpu_kernels.backend:CpuPagedBackend"],
    ),
}


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("wheels")
    # Build from copies: setuptools writes *.egg-info into the source tree, and a stale one
    # at the repository root would shadow the installed metadata (and its entry points).
    ignore = shutil.ignore_patterns(
        ".git", ".nox", "tests", "plugins", "benchmarks", "*.egg-info", "build", "*.so"
    )
    sources = []
    for name, (source, _, _) in DISTRIBUTIONS.items():
        copy = tmp_path_factory.mktemp("src") / name
        shutil.copytree(ROOT / source, copy, ignore=ignore)
        sources.append(str(copy))
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w"]
    subprocess.run([*cmd, str(out), *sources], check=True, capture_output=True)
    return {name: next(out.glob(f"{name.replace('-', '_')}-*.whl")) for name in DISTRIBUTIONS}


@pytest.mark.slow
@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_wheel_carries_package_metadata_and_entry_points(wheels, name):
    _, package, entry_lines = DISTRIBUTIONS[name]
    with zipfile.ZipFile(wheels[name]) as wheel:
        files = wheel.namelist()
        assert f"{package}/__init__.py" in files and f"{package}/py.typed" in files
        meta = next(f for f in files if f.endswith(".dist-info/METADATA"))
        metadata = wheel.read(meta).decode()
        entry_file = next((f for f in files if f.endswith("entry_points.txt")), None)
        entries = wheel.read(entry_file).decode() if entry_file else ""
        init = wheel.read(f"{package}/__init__.py").decode()
    assert f"Name: {name}" in metadata
    if name == "core-cpu-kernels":  # compiled while the wheel was built, not shipped as source
        assert any(f.startswith("core_cpu_kernels/_C") and f.endswith(".so") for f in files)
    for line in entry_lines:
        assert line in entries
    if name != "core":
        assert "Requires-Dist: core" in metadata
        assert "CORE_PLUGIN_API" in init
