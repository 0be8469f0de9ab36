"""load_weights maps Hugging Face names onto fused parameters and names what does not fit."""

from __future__ import annotations

import pytest
import torch
from model_harness import tiny_hf_model

from core.models import ArchConfig, iter_attention_layers
from core.models.qwen2 import Qwen2ForCausalLM


@pytest.fixture(scope="module")
def hf_qwen2():
    return tiny_hf_model("Qwen2ForCausalLM")


def empty_model(hf_model) -> Qwen2ForCausalLM:
    return Qwen2ForCausalLM(ArchConfig.from_hf(hf_model.config.to_dict()))


def test_q_k_v_land_in_the_fused_projection(hf_qwen2):
    model = empty_model(hf_qwen2)
    model.load_weights(hf_qwen2.state_dict().items())
    hf_attn = hf_qwen2.model.layers[1].self_attn
    fused = torch.cat([hf_attn.q_proj.bias, hf_attn.k_proj.bias, hf_attn.v_proj.bias])

    assert torch.equal(model.model.layers[1].self_attn.qkv_proj.bias, fused)


def test_missing_weight_is_named(hf_qwen2):
    state = dict(hf_qwen2.state_dict())
    del state["model.layers.1.self_attn.k_proj.bias"]
    expected = r"missing weights \['model.layers.1.self_attn.k_proj.bias'\]"
    with pytest.raises(ValueError, match=expected):
        empty_model(hf_qwen2).load_weights(state.items())


def test_untied_model_needs_lm_head(hf_qwen2):
    state = dict(hf_qwen2.state_dict())
    del state["lm_head.weight"]
    with pytest.raises(ValueError, match=r"missing weights \['lm_head.weight'\]"):
        empty_model(hf_qwen2).load_weights(state.items())


def test_unexpected_weight_is_named(hf_qwen2):
    state = dict(hf_qwen2.state_dict())
    state["model.layers.0.mlp.extra_proj.weight"] = torch.zeros(2, 2)
    with pytest.raises(ValueError, match=r"unexpected weights \['model.layers.0.mlp.extra_proj"):
        empty_model(hf_qwen2).load_weights(state.items())


def test_wrong_shape_names_the_checkpoint_weight(hf_qwen2):
    state = dict(hf_qwen2.state_dict())
    state["model.layers.0.mlp.up_proj.weight"] = torch.zeros(3, 64)
    with pytest.raises(ValueError, match=r"'model.layers.0.mlp.up_proj.weight': shape \(3, 64\)"):
        empty_model(hf_qwen2).load_weights(state.items())


def test_rotary_inv_freq_in_a_checkpoint_is_ignored(hf_qwen2):
    state = dict(hf_qwen2.state_dict())
    state["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.zeros(8)
    empty_model(hf_qwen2).load_weights(state.items())


def test_attention_layers_are_named_by_module_prefix(hf_qwen2):
    names = [layer.layer_name for layer in iter_attention_layers(empty_model(hf_qwen2))]
    assert names == ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
