"""Hub ids are downloaded, from a stand-in hub on 127.0.0.1: only the files a load reads,
into the Hugging Face cache, then read from there with the hub stopped or offline."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import httpx
import pytest
from hub_stand_in import HubStandIn, point_hub_library_at
from server_process import ServerProcess
from tiny_checkpoints import tiny_model, write_gguf_model

from core.model_loader import GGUFCheckpoint, SafetensorsCheckpoint, resolve_model
from core.testing.tiny_checkpoint import reference_model, write_tiny_checkpoint
from core.testing.tiny_vlm import write_tiny_vlm

TOKEN = "hf_stand_in_token"
# What write_tiny_checkpoint writes: everything a load reads, and nothing else.
NEEDED = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
}


def with_decoys(directory: Path) -> Path:
    """Files a load never reads, which must never be fetched."""
    (directory / "extra").mkdir(parents=True)
    (directory / "extra" / "large.bin").write_bytes(b"\1" * 100_000)
    (directory / "pytorch_model.bin").write_bytes(b"\2" * 100_000)
    (directory / "README.md").write_text("# a tiny model\n")
    return directory


@pytest.fixture(scope="module")
def repo_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hub-repos")
    dirs = {
        "main": with_decoys(write_tiny_checkpoint(root / "main")),
        "v2": write_tiny_checkpoint(root / "v2", reference_model(num_hidden_layers=1)),
        "gguf": with_decoys(root / "gguf"),
        "sharded": with_decoys(root / "sharded"),
        "no-weights": root / "no-weights",
        "vlm": with_decoys(write_tiny_vlm(root / "vlm", "llava-clip")),
    }
    # Two different files: the hub library would not fetch a second copy of the same bytes.
    for quant_type, num_layers in (("Q4_K_M", 2), ("Q8_0", 1)):
        llama = tiny_model("llama", num_hidden_layers=num_layers)
        write_gguf_model(dirs["gguf"] / f"tiny-llama-{quant_type}.gguf", llama)
    reference_model().save_pretrained(dirs["sharded"], max_shard_size="20KB")
    (dirs["sharded"] / "consolidated.safetensors").write_bytes(b"\3" * 100_000)
    dirs["no-weights"].mkdir()
    (dirs["no-weights"] / "README.md").write_text("# nothing to load\n")
    return dirs


def serve_repos(hub: HubStandIn, dirs: dict[str, Path]) -> HubStandIn:
    hub.add_repo("acme/tiny", {"main": dirs["main"], "v2": dirs["v2"]})
    hub.add_repo("acme/tiny-GGUF", {"main": dirs["gguf"]})
    hub.add_repo("acme/sharded", {"main": dirs["sharded"]})
    hub.add_repo("acme/gated", {"main": dirs["main"]}, token=TOKEN)
    hub.add_repo("acme/tiny-vlm", {"main": dirs["vlm"]})
    return hub.add_repo("acme/no-weights", {"main": dirs["no-weights"]})


@pytest.fixture
def hub(repo_dirs):
    with serve_repos(HubStandIn(), repo_dirs) as hub:
        yield hub


@pytest.fixture
def hf_cache(hub, monkeypatch, tmp_path) -> Path:
    """An empty Hugging Face cache, with the hub library pointed at the stand-in."""
    cache = tmp_path / "hf-cache"
    point_hub_library_at(monkeypatch, hub.url, cache)
    return cache


class Terminal(io.StringIO):
    """A stderr that says it is a terminal: the hub library draws its bytes bar only there."""

    def isatty(self) -> bool:
        return True


def test_a_hub_id_is_downloaded_into_the_cache_with_a_progress_bar(hub, hf_cache, monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    checkpoint = resolve_model("acme/tiny")
    assert isinstance(checkpoint, SafetensorsCheckpoint)
    assert checkpoint.served_name == "acme/tiny"
    commit = hub.commit("acme/tiny")
    assert checkpoint.path == hf_cache / "models--acme--tiny" / "snapshots" / commit
    assert {p.name for p in checkpoint.path.iterdir()} == NEEDED
    assert checkpoint.hf_config["num_hidden_layers"] == 2
    assert hub.fetched("acme/tiny") == NEEDED
    assert not any("large.bin" in r.path or "pytorch_model" in r.path for r in hub.requests)
    assert "Fetching 5 files: 100%" in terminal.getvalue()
    assert "Download complete" in terminal.getvalue()  # the bytes bar, drawn on terminals


def test_a_downloaded_hub_id_resolves_from_the_cache_with_the_hub_stopped_or_offline(
    hub, hf_cache, monkeypatch
):
    first = resolve_model("acme/tiny").path
    hub.stop()
    assert resolve_model("acme/tiny").path == first
    point_hub_library_at(monkeypatch, hub.url, hf_cache, offline=True)
    assert resolve_model("acme/tiny").path == first


def test_revision_picks_the_branch_and_download_dir_the_cache(hub, hf_cache, tmp_path):
    other = tmp_path / "download-dir"
    checkpoint = resolve_model("acme/tiny", revision="v2", download_dir=str(other))
    assert checkpoint.hf_config["num_hidden_layers"] == 1
    commit = hub.commit("acme/tiny", "v2")
    assert checkpoint.path == other / "models--acme--tiny" / "snapshots" / commit
    assert (other / "models--acme--tiny" / "refs" / "v2").read_text() == commit
    assert not hf_cache.exists()
    assert resolve_model("acme/tiny").hf_config["num_hidden_layers"] == 2


def test_a_vision_model_fetches_its_image_processor_config(hub, hf_cache):
    checkpoint = resolve_model("acme/tiny-vlm")
    assert hub.fetched("acme/tiny-vlm") == NEEDED | {"preprocessor_config.json"}
    assert (checkpoint.path / "preprocessor_config.json").is_file()


def test_a_sharded_checkpoint_fetches_the_shards_its_index_names_only(hub, hf_cache, repo_dirs):
    checkpoint = resolve_model("acme/sharded")
    shards = {p.name for p in repo_dirs["sharded"].glob("model-*.safetensors")}
    assert len(shards) > 1
    assert hub.fetched("acme/sharded") == {
        "config.json", "generation_config.json", "model.safetensors.index.json", *shards,
    }  # fmt: skip
    assert {p.name for p in checkpoint.weight_files} == shards


def test_the_quant_type_notation_fetches_only_that_gguf(hub, hf_cache):
    checkpoint = resolve_model("acme/tiny-GGUF:Q4_K_M")
    assert isinstance(checkpoint, GGUFCheckpoint)
    assert checkpoint.path.name == "tiny-llama-Q4_K_M.gguf"
    assert checkpoint.served_name == "acme/tiny-GGUF:Q4_K_M"
    assert hub.fetched("acme/tiny-GGUF") == {"tiny-llama-Q4_K_M.gguf"}
    assert resolve_model("acme/tiny-GGUF:q8_0").path.name == "tiny-llama-Q8_0.gguf"  # any case
    assert hub.fetched("acme/tiny-GGUF") == {"tiny-llama-Q4_K_M.gguf", "tiny-llama-Q8_0.gguf"}


def test_a_gated_repo_needs_hf_token(hub, hf_cache, monkeypatch):
    with pytest.raises(ValueError) as refused:
        resolve_model("acme/gated")
    assert str(refused.value) == (
        f"model acme/gated: a gated repository on the Hugging Face Hub ({hub.url}); accept "
        "its conditions there and set HF_TOKEN to a token of an account with access"
    )
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(ValueError, match="the token .* does not give access"):
        resolve_model("acme/gated")
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert resolve_model("acme/gated").served_name == "acme/gated"
    assert hub.fetched("acme/gated") == NEEDED


LACKS = [
    ("acme/absent", None, "no such repository on the Hugging Face Hub"),
    ("acme/tiny", "v9", "the repository on the Hugging Face Hub .* has no revision v9"),
    (
        "acme/no-weights",
        None,
        "the repository has no config.json with safetensors weights .*; for a GGUF "
        "repository name the quant type of its file, e.g. acme/no-weights:Q4_K_M",
    ),
    (
        "acme/tiny-GGUF:Q5_K_M",
        None,
        "the repository has no single .gguf file of quant type Q5_K_M",
    ),
]


@pytest.mark.parametrize(("model", "revision", "cause"), LACKS)
def test_what_the_hub_lacks_is_a_one_line_value_error(hub, hf_cache, model, revision, cause):
    with pytest.raises(ValueError, match=f"^model {model}: {cause}") as refused:
        resolve_model(model, revision)
    assert "\n" not in str(refused.value)
    assert hub.fetched(model.split(":")[0]) == set()


def test_offline_with_an_empty_cache_is_a_value_error_and_asks_nothing(hub, hf_cache, monkeypatch):
    point_hub_library_at(monkeypatch, hub.url, hf_cache, offline=True)
    with pytest.raises(ValueError) as refused:
        resolve_model("acme/tiny")
    assert str(refused.value) == (
        f"model acme/tiny: not in the Hugging Face cache {hf_cache}, and HF_HUB_OFFLINE=1 "
        "forbids downloading it"
    )
    assert hub.requests == []


def test_an_unreachable_hub_with_an_empty_cache_is_a_value_error(hub, hf_cache):
    hub.stop()
    unreachable = r"and the hub \(http://127.0.0.1:\d+\) cannot be reached: "
    with pytest.raises(
        ValueError, match=f"^model acme/tiny: not in the .*, {unreachable}"
    ) as refused:
        resolve_model("acme/tiny")
    assert "\n" not in str(refused.value)


@pytest.mark.slow
def test_core_serve_downloads_a_hub_id_starts_again_offline_and_exits_1_when_it_cannot(
    hub, tmp_path, monkeypatch
):
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE"):
        monkeypatch.delenv(name, raising=False)
    env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf-home")}
    small = ["--dtype", "float32", "--max-model-len", "64", "--kv-cache-memory", "4MiB"]
    server = ServerProcess("acme/tiny", *small, env=env)
    try:
        server.wait_ready()
        body = {"model": "acme/tiny", "prompt": "user : w1", "max_tokens": 4, "ignore_eos": True}
        reply = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).json()
        assert reply["model"] == "acme/tiny"
        assert reply["usage"]["completion_tokens"] == 4
    finally:
        server.stop()
    assert hub.fetched("acme/tiny") == NEEDED
    assert (tmp_path / "hf-home" / "hub" / "models--acme--tiny").is_dir()
    assert "Fetching 5 files" in server.log.read_text()  # the download's progress
    offline = {"HF_HOME": str(tmp_path / "empty-hf-home"), "HF_HUB_OFFLINE": "1"}
    for model, more_env, cause in [
        ("acme/gated", {}, "a gated repository"),
        ("acme/absent", {}, "no such repository"),
        ("acme/tiny", offline, "not in the Hugging Face cache"),
    ]:
        failed = ServerProcess(model, *small, env=env | more_env)
        assert failed.wait_exit(120) == 1
        # Above it: core's INFO lines on platform choice, and the hub library's bar.
        lines = failed.log.read_text().splitlines()
        assert [line for line in lines if line.startswith("Error")] == lines[-1:], lines
        assert lines[-1].startswith(f"Error: model {model}: {cause}"), lines
        assert "Traceback" not in failed.log.read_text()
    hub.stop()  # the second start reads the cache: the hub is unreachable
    again = ServerProcess("acme/tiny", *small, env=env)
    try:
        again.wait_ready()
        reply = httpx.post(f"{again.url}/v1/completions", json=body, timeout=60).json()
        assert reply["usage"]["completion_tokens"] == 4
    finally:
        again.stop()
