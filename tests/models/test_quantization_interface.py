"""A QuantizationConfig swaps how linear layers store weights and multiply, invisibly."""

from __future__ import annotations

import importlib.metadata as metadata

import pytest
import torch
from model_harness import assert_logits_match, hf_logits, our_model, run_logits, tiny_hf_model
from plugin_sources import API
from torch import nn

from core.models.layers import LinearBase
from core.plugins import PluginRegistry
from core.plugins.groups import ALL_GROUPS, QUANTIZATION
from core.quantization import (
    LinearMethod,
    LinearSplit,
    QuantizationConfig,
    UnquantizedLinearMethod,
    fused_weight_loader,
    get_quantization_config_class,
    set_weight_loader,
)


class DoubledTransposedMethod(LinearMethod):
    """Stores 2 * W^T ([input, output], shards side by side) and halves it back in apply."""

    def create_weights(self, layer, partition, bias, dtype):
        input_size, output_sizes = partition.input_size, partition.output_sizes
        columns = fused_weight_loader(output_sizes, output_dim=1)

        def load(param, loaded, shard_id=None):
            columns(param, 2 * loaded.t(), shard_id)

        weight = nn.Parameter(
            torch.empty(input_size, sum(output_sizes), dtype=dtype), requires_grad=False
        )
        set_weight_loader(weight, load)
        layer.register_parameter("weight", weight)
        if bias:
            bias_param = nn.Parameter(
                torch.empty(sum(output_sizes), dtype=dtype), requires_grad=False
            )
            set_weight_loader(bias_param, fused_weight_loader(output_sizes))
            layer.register_parameter("bias", bias_param)

    def apply(self, layer, x, bias):
        out = x @ (layer.weight / 2)  # [T, input] @ [input, output]
        return out if bias is None else out + bias

    def dequantize(self, layer):
        return layer.weight.t() / 2


class DoubledConfig(QuantizationConfig):
    """Doubles every linear layer except the ones named in `skip`."""

    name = "doubled"

    def __init__(self, skip: tuple[str, ...] = ()) -> None:
        self.skip = skip
        self.asked: list[str] = []

    @classmethod
    def from_config(cls, hf_quant_config):
        return cls(tuple(hf_quant_config.get("modules_to_not_convert", ())))

    def get_linear_method(self, layer_name):
        self.asked.append(layer_name)
        if any(part in layer_name for part in self.skip):
            return UnquantizedLinearMethod()
        return DoubledTransposedMethod()


@pytest.fixture(scope="module")
def hf_qwen2():  # q/k/v carry biases, o_proj none: both paths of the method
    return tiny_hf_model("Qwen2ForCausalLM")


def test_swapped_linear_method_gives_the_same_logits(hf_qwen2):
    quant_config = DoubledConfig.from_config({"modules_to_not_convert": ["down_proj"]})
    model = our_model(hf_qwen2, quant_config)
    input_ids = torch.randint(0, 256, (10,))

    qkv = model.model.layers[0].self_attn.qkv_proj
    assert qkv.weight.shape == (64, 128)  # stored transposed: [hidden, (4 + 2 + 2) * 16]
    assert isinstance(model.model.layers[0].mlp.down_proj.linear_method, UnquantizedLinearMethod)
    assert_logits_match(run_logits(model, input_ids), hf_logits(hf_qwen2, input_ids))


def test_projections_are_split_the_way_tensor_parallelism_shards_them(hf_qwen2):
    layer = our_model(hf_qwen2).model.layers[0]
    splits = {
        name: module.partition.split
        for name, module in layer.named_modules()
        if isinstance(module, LinearBase)
    }
    assert splits == {
        "self_attn.qkv_proj": LinearSplit.COLUMN,
        "self_attn.o_proj": LinearSplit.ROW,
        "mlp.gate_up_proj": LinearSplit.COLUMN,
        "mlp.down_proj": LinearSplit.ROW,
    }


def test_config_is_asked_once_per_linear_layer_by_module_prefix(hf_qwen2):
    quant_config = DoubledConfig()
    our_model(hf_qwen2, quant_config)
    assert quant_config.asked[:4] == [
        "model.layers.0.self_attn.qkv_proj",
        "model.layers.0.self_attn.o_proj",
        "model.layers.0.mlp.gate_up_proj",
        "model.layers.0.mlp.down_proj",
    ]
    assert len(quant_config.asked) == 8


QUANT_PLUGIN = {
    "acme_quant/__init__.py": API,
    "acme_quant/config.py": """
        from core.quantization import QuantizationConfig, UnquantizedLinearMethod

        class AcmeConfig(QuantizationConfig):
            name = "acme"

            @classmethod
            def from_config(cls, hf_quant_config):
                return cls()

            def get_linear_method(self, layer_name):
                return UnquantizedLinearMethod()
    """,
}


def discover() -> PluginRegistry:
    points = [ep for group in ALL_GROUPS for ep in metadata.entry_points(group=group)]
    return PluginRegistry(points, allowlist=None)


def test_quantization_method_is_found_by_entry_name(site):
    site.add("acme-quant", {QUANTIZATION: {"acme": "acme_quant.config:AcmeConfig"}}, QUANT_PLUGIN)
    cls = get_quantization_config_class("acme", discover())
    assert issubclass(cls, QuantizationConfig) and cls.name == "acme"


def test_unknown_quantization_method_lists_the_installed_ones(site):
    site.add("acme-quant", {QUANTIZATION: {"acme": "acme_quant.config:AcmeConfig"}}, QUANT_PLUGIN)
    # the plugin's, core's own (gguf, gptq...) and core-quant-awq's where it is installed
    installed = r"acme, (awq, )?.*\bgguf, gptq\b"
    with pytest.raises(
        ValueError, match=f"quantization method 'marlin' is not installed; installed: {installed}"
    ):
        get_quantization_config_class("marlin", discover())


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 3])
def test_dense_linear_matches_f_linear_in_bfloat16(rows, bias):
    # A single 16-bit row takes torch.mv (faster on CPUs); it must compute the same thing.
    from core.quantization.unquantized import dense_linear

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rows, 64, generator=gen).bfloat16()
    weight = torch.randn(32, 64, generator=gen).bfloat16()
    b = torch.randn(32, generator=gen).bfloat16() if bias else None
    got = dense_linear(x, weight, b)
    assert got.shape == (rows, 32) and got.dtype == torch.bfloat16
    expected = torch.nn.functional.linear(
        x.float(), weight.float(), None if b is None else b.float()
    )
    torch.testing.assert_close(got.float(), expected, atol=0.1, rtol=0.02)
