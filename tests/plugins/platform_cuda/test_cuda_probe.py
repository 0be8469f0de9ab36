"""core-cuda's probe without a GPU: torch's build record, the driver's GPU directories and
CUDA_VISIBLE_DEVICES are mocked; each reason it gives is pinned, and `core info` shows it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from core_cuda import probe as cuda_probe

from core.entrypoints.cli import cli
from core.platforms import Unavailable
from core.platforms.torch_build import TorchBuild

CUDA_BUILD = TorchBuild({"__version__": "2.13.0+cu128", "cuda": "12.8"})
PLATFORM_PATH = "core_cuda.platform.CudaPlatform"


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """`host(num_gpus, build=CUDA_BUILD)`: a machine whose driver lists `num_gpus` GPUs
    (directories named by PCI bus id, as /proc/driver/nvidia/gpus has them)."""

    def make(num_gpus: int, build: TorchBuild | None = CUDA_BUILD) -> None:
        gpus = tmp_path / "gpus"
        gpus.mkdir(exist_ok=True)
        for i in range(num_gpus):
            (gpus / f"0000:{i + 0x18:02x}:00.0").mkdir()
        monkeypatch.setattr(cuda_probe, "DRIVER_GPUS", str(gpus / "*"))
        monkeypatch.setattr(cuda_probe, "torch_build", lambda: build)

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return make


def reason(monkeypatch: pytest.MonkeyPatch, visible: str | None = None) -> str | None:
    """The probe's Unavailable reason (None: it found the platform)."""
    if visible is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    try:
        assert cuda_probe.probe() == PLATFORM_PATH
    except Unavailable as unavailable:
        return unavailable.reason
    return None


def test_a_cpu_build_of_torch_is_unavailable(host, monkeypatch):
    host(2, TorchBuild({"__version__": "2.13.0+cpu"}))
    assert reason(monkeypatch) == "torch 2.13.0+cpu is not a CUDA build"


def test_without_torch_it_is_unavailable(host, monkeypatch):
    host(2, None)
    assert reason(monkeypatch) == "torch (not installed) is not a CUDA build"


def test_without_a_driver_gpu_it_is_unavailable(host, monkeypatch):
    host(0)
    assert reason(monkeypatch) == "no NVIDIA GPU driver or device found (/proc/driver/nvidia/gpus)"


def test_a_gpu_and_no_device_variable_is_available(host, monkeypatch):
    host(2)
    assert reason(monkeypatch) is None


@pytest.mark.parametrize("visible", ["", " "])
def test_an_empty_device_variable_hides_every_gpu(host, monkeypatch, visible):
    host(2)
    assert reason(monkeypatch, visible) == (
        f"CUDA_VISIBLE_DEVICES is set to {visible!r}, which hides every NVIDIA GPU"
    )


@pytest.mark.parametrize("visible", ["-1", "2", "7,0", "-1,0"])
def test_a_device_variable_that_starts_with_no_device_hides_every_gpu(host, monkeypatch, visible):
    host(2)
    assert reason(monkeypatch, visible) == (
        f"CUDA_VISIBLE_DEVICES={visible!r} names no NVIDIA GPU: this host has 2 (ids 0-1), "
        "and the list ends at its first entry that is not one"
    )


@pytest.mark.parametrize("visible", ["1", "1,0", "0,-1", "GPU-8f6c3a2e"])
def test_a_device_variable_naming_a_gpu_is_available(host, monkeypatch, visible):
    host(2)
    assert reason(monkeypatch, visible) is None


def test_core_info_shows_why_cuda_is_unavailable(host, monkeypatch, fresh_registry):
    host(1)
    result = CliRunner().invoke(
        cli, ["info"], env={"CUDA_VISIBLE_DEVICES": "-1"}, catch_exceptions=False
    )
    assert result.exit_code == 0
    assert (
        "rejected cuda: unavailable: CUDA_VISIBLE_DEVICES='-1' names no NVIDIA GPU: "
        "this host has 1 (id 0)"
    ) in result.output


@pytest.mark.skipif(torch.version.cuda is not None, reason="this machine's torch is a CUDA build")
def test_core_info_on_this_machine_says_torch_is_not_a_cuda_build(fresh_registry):
    result = CliRunner().invoke(cli, ["info"], catch_exceptions=False)
    assert f"rejected cuda: unavailable: torch {torch.__version__} is not a CUDA build" in (
        result.output
    )
