"""HF directories: single and sharded safetensors, config.json, and the errors on bad files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from tiny_checkpoints import tiny_model

from core.model_loader import load_safetensors_checkpoint


@pytest.fixture(scope="module")
def model() -> transformers.PreTrainedModel:
    return tiny_model("llama")


@pytest.fixture(scope="module")
def single_dir(model, tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("single") / "tiny-llama"
    model.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def sharded_dir(model, tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("sharded") / "tiny-llama"
    model.save_pretrained(directory, max_shard_size="50KB")
    return directory


@pytest.mark.parametrize("layout", ["single_dir", "sharded_dir"])
def test_every_state_dict_tensor_is_yielded_exactly(model, layout, request):
    checkpoint = load_safetensors_checkpoint(request.getfixturevalue(layout))
    weights = dict(checkpoint.iter_weights(torch.float32))
    state = model.state_dict()
    assert sorted(weights) == sorted(state)
    for name, tensor in state.items():
        assert torch.equal(weights[name], tensor), name


def test_sharded_directory_reads_every_shard_of_the_index(sharded_dir):
    checkpoint = load_safetensors_checkpoint(sharded_dir)
    index = json.loads((sharded_dir / "model.safetensors.index.json").read_text())
    weight_map = index["weight_map"]
    assert len(checkpoint.weight_files) == len(set(weight_map.values())) > 1


def test_weights_are_cast_to_the_requested_dtype(model, single_dir):
    weights = dict(load_safetensors_checkpoint(single_dir).iter_weights(torch.bfloat16))
    for name, tensor in model.state_dict().items():
        assert torch.equal(weights[name], tensor.to(torch.bfloat16)), name


def test_config_keeps_config_json_and_adds_the_classic_rope_and_dtype_keys(model, single_dir):
    checkpoint = load_safetensors_checkpoint(single_dir)
    config = checkpoint.hf_config
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["hidden_size"] == model.config.hidden_size
    assert config["rope_parameters"]["rope_theta"] == config["rope_theta"] == 50000.0
    assert config["rope_scaling"] is None
    assert config["torch_dtype"] == "float32"
    assert checkpoint.served_name == "tiny-llama"
    assert checkpoint.path == single_dir


def test_served_name_can_be_given(single_dir):
    assert load_safetensors_checkpoint(single_dir, "org/tiny").served_name == "org/tiny"


def _copy(source: Path, destination: Path) -> Path:
    destination.mkdir()
    for file in source.iterdir():
        (destination / file.name).write_bytes(file.read_bytes())
    return destination


def test_missing_config_json_is_a_value_error_naming_it(single_dir, tmp_path):
    directory = _copy(single_dir, tmp_path / "broken")
    (directory / "config.json").unlink()
    with pytest.raises(ValueError, match="config.json is missing"):
        load_safetensors_checkpoint(directory)


def test_invalid_config_json_is_a_value_error_naming_it(single_dir, tmp_path):
    directory = _copy(single_dir, tmp_path / "broken")
    (directory / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config.json is not valid JSON"):
        load_safetensors_checkpoint(directory)


def test_missing_shard_is_a_value_error_naming_it(sharded_dir, tmp_path):
    directory = _copy(sharded_dir, tmp_path / "broken")
    shard = sorted(path.name for path in directory.glob("model-*.safetensors"))[1]
    (directory / shard).unlink()
    with pytest.raises(ValueError, match=f"{shard}, which is missing"):
        load_safetensors_checkpoint(directory)


def test_directory_without_weights_is_a_value_error(single_dir, tmp_path):
    directory = _copy(single_dir, tmp_path / "broken")
    (directory / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="neither model.safetensors nor"):
        load_safetensors_checkpoint(directory)


@pytest.mark.parametrize("keep", [0.5, 0.999, 4])
def test_truncated_safetensors_is_a_value_error_naming_the_file(single_dir, tmp_path, keep):
    directory = _copy(single_dir, tmp_path / "broken")
    weights = directory / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: int(len(data) * keep) if keep < 1 else keep])
    with pytest.raises(ValueError, match="model.safetensors: corrupt safetensors file"):
        load_safetensors_checkpoint(directory)


def test_missing_directory_is_a_value_error_naming_it(tmp_path):
    with pytest.raises(ValueError, match="nowhere does not exist"):
        load_safetensors_checkpoint(tmp_path / "nowhere")
