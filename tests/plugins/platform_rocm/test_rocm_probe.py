"""core-rocm's probe without a GPU: torch's build record, the kernel driver's device file
and topology, and the device-selection variables are mocked; each reason is pinned."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from core_rocm import probe as rocm_probe

from core.entrypoints.cli import cli
from core.platforms import Unavailable
from core.platforms.torch_build import TorchBuild

ROCM_BUILD = TorchBuild({"__version__": "2.13.0+rocm6.4", "hip": "6.4.43482"})
PLATFORM_PATH = "core_rocm.platform.RocmPlatform"


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """`host(num_gpus, kfd=True, build=ROCM_BUILD)`: a machine whose KFD topology has one
    CPU node (gpu_id 0) and `num_gpus` GPU nodes."""

    def make(num_gpus: int, kfd: bool = True, build: TorchBuild | None = ROCM_BUILD) -> None:
        nodes = tmp_path / "nodes"
        for node, gpu_id in enumerate([0, *range(41000, 41000 + num_gpus)]):
            (nodes / str(node)).mkdir(parents=True)
            (nodes / str(node) / "gpu_id").write_text(f"{gpu_id}\n")
        device = tmp_path / "kfd"
        if kfd:
            device.touch()
        monkeypatch.setattr(rocm_probe, "KFD", str(device))
        monkeypatch.setattr(rocm_probe, "KFD_NODES", str(nodes / "*" / "gpu_id"))
        monkeypatch.setattr(rocm_probe, "torch_build", lambda: build)

    for env_var in ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(env_var, raising=False)
    return make


def reason(monkeypatch: pytest.MonkeyPatch, **env: str) -> str | None:
    """The probe's Unavailable reason (None: it found the platform) under `env`."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    try:
        assert rocm_probe.probe() == PLATFORM_PATH
    except Unavailable as unavailable:
        return unavailable.reason
    return None


def test_a_build_without_hip_is_unavailable(host, monkeypatch):
    host(1, build=TorchBuild({"__version__": "2.13.0+cu128", "cuda": "12.8"}))
    assert reason(monkeypatch) == "torch 2.13.0+cu128 is not a ROCm build"


def test_without_the_kernel_driver_it_is_unavailable(host, monkeypatch, tmp_path):
    host(1, kfd=False)
    assert reason(monkeypatch) == f"no AMD GPU kernel driver ({tmp_path / 'kfd'}) found"


def test_a_topology_of_cpu_nodes_only_is_unavailable(host, monkeypatch):
    host(0)
    assert reason(monkeypatch) == (
        "the AMD GPU kernel driver lists no GPU (/sys/class/kfd topology)"
    )


def test_gpus_and_no_device_variable_are_available(host, monkeypatch):
    host(2)
    assert rocm_probe.count_gpus() == 2
    assert reason(monkeypatch) is None


@pytest.mark.parametrize("env_var", ["HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"])
def test_either_device_variable_can_hide_every_gpu(host, monkeypatch, env_var):
    host(2)
    assert reason(monkeypatch, **{env_var: ""}) == (
        f"{env_var} is set to '', which hides every AMD GPU"
    )


def test_a_device_variable_naming_no_gpu_is_unavailable(host, monkeypatch):
    host(2)
    assert reason(monkeypatch, HIP_VISIBLE_DEVICES="3,1") == (
        "HIP_VISIBLE_DEVICES='3,1' names no AMD GPU: this host has 2 (ids 0-1), "
        "and the list ends at its first entry that is not one"
    )


def test_device_variables_naming_gpus_are_available(host, monkeypatch):
    host(2)
    assert reason(monkeypatch, HIP_VISIBLE_DEVICES="1", CUDA_VISIBLE_DEVICES="0") is None


def test_core_info_shows_why_rocm_is_unavailable(host, monkeypatch, fresh_registry):
    host(1)
    result = CliRunner().invoke(
        cli, ["info"], env={"HIP_VISIBLE_DEVICES": "-1"}, catch_exceptions=False
    )
    assert (
        "rejected rocm: unavailable: HIP_VISIBLE_DEVICES='-1' names no AMD GPU: "
        "this host has 1 (id 0)"
    ) in result.output
