"""A WrappedLinearMethod adds to whatever method a layer has, quantized or not.

The expected outputs are built here from the tensors the test loads (the dense weight, or
the int8 values times their scales, plus B @ A), never from the methods under test.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from core.models.layers import MergedLinear
from core.quantization import (
    LinearMethod,
    QuantizationConfig,
    UnquantizedLinearMethod,
    WrappedLinearMethod,
    add_parameter,
    default_weight_loader,
    fused_weight_loader,
)

INPUT, OUTPUTS, RANK = 16, [8, 4], 2


class Int8RowScaledMethod(LinearMethod):
    """A toy quantized format: int8 `qweight` and one float `scales` entry per output row."""

    def create_weights(self, layer, partition, bias, dtype):
        outputs = partition.output_sizes_per_partition
        loader = fused_weight_loader(outputs)
        shape = (sum(outputs), partition.input_size_per_partition)
        add_parameter(layer, "qweight", shape, torch.int8, loader)
        add_parameter(layer, "scales", (sum(outputs),), dtype, loader)
        if bias:
            add_parameter(layer, "bias", (sum(outputs),), dtype, loader)

    def apply(self, layer, x, bias):
        out = (x @ layer.qweight.t().to(x.dtype)) * layer.scales  # scale after the matmul
        return out if bias is None else out + bias

    def dequantize(self, layer):
        return layer.qweight.to(layer.scales.dtype) * layer.scales[:, None]


class LowRankDelta(WrappedLinearMethod):
    """y = base(x) + x A^T B^T, the shape of a LoRA adapter."""

    def add_weights(self, layer, partition, dtype):
        outputs = sum(partition.output_sizes_per_partition)
        inputs = partition.input_size_per_partition
        add_parameter(layer, "delta_a", (RANK, inputs), dtype, default_weight_loader)
        add_parameter(layer, "delta_b", (outputs, RANK), dtype, default_weight_loader)

    def apply(self, layer, x, bias):
        return self.base.apply(layer, x, bias) + (x @ layer.delta_a.t()) @ layer.delta_b.t()

    def dequantize(self, layer):
        return self.base.dequantize(layer) + layer.delta_b @ layer.delta_a


class OneMethodConfig(QuantizationConfig):
    name = "one_method"

    def __init__(self, method: LinearMethod) -> None:
        self.method = method

    @classmethod
    def from_config(cls, hf_quant_config):
        return cls(UnquantizedLinearMethod())

    def get_linear_method(self, layer_name):
        return self.method


def load(param: nn.Parameter, tensor: torch.Tensor, shard_id=None) -> None:
    param.weight_loader(param, tensor, shard_id)


def unquantized_layer(gen: torch.Generator) -> tuple[MergedLinear, torch.Tensor]:
    layer = MergedLinear(INPUT, OUTPUTS, bias=True, prefix="mlp.gate_up")
    dense = torch.randn(sum(OUTPUTS), INPUT, generator=gen)
    load(layer.weight, dense[:8], 0)
    load(layer.weight, dense[8:], 1)
    return layer, dense


def int8_layer(gen: torch.Generator) -> tuple[MergedLinear, torch.Tensor]:
    config = OneMethodConfig(Int8RowScaledMethod())
    layer = MergedLinear(INPUT, OUTPUTS, bias=True, quant_config=config, prefix="mlp.gate_up")
    q = torch.randint(-127, 128, (sum(OUTPUTS), INPUT), generator=gen, dtype=torch.int8)
    scales = torch.rand(sum(OUTPUTS), generator=gen) / 64
    for shard, rows in ((0, slice(0, 8)), (1, slice(8, 12))):
        load(layer.qweight, q[rows], shard)
        load(layer.scales, scales[rows], shard)
    return layer, q.float() * scales[:, None]


@pytest.mark.parametrize("make_layer", [unquantized_layer, int8_layer])
def test_low_rank_wrapper_adds_its_delta_to_any_base(make_layer):
    gen = torch.Generator().manual_seed(0)
    layer, dense = make_layer(gen)
    bias = torch.randn(sum(OUTPUTS), generator=gen)
    load(layer.bias, bias[:8], 0)
    load(layer.bias, bias[8:], 1)
    base = layer.linear_method

    layer.wrap_linear_method(LowRankDelta)
    a, b = torch.randn(RANK, INPUT, generator=gen), torch.randn(sum(OUTPUTS), RANK, generator=gen)
    load(layer.delta_a, a)
    load(layer.delta_b, b)

    x = torch.randn(5, INPUT, generator=gen)
    expected_weight = dense + b @ a
    assert layer.linear_method.base is base
    torch.testing.assert_close(layer.linear_method.dequantize(layer), expected_weight)
    torch.testing.assert_close(layer(x), x @ expected_weight.t() + bias, rtol=1e-4, atol=1e-4)


def test_wrapped_method_from_a_config_creates_base_and_own_weights_together():
    config = OneMethodConfig(LowRankDelta(Int8RowScaledMethod()))
    layer = MergedLinear(INPUT, OUTPUTS, quant_config=config, prefix="mlp.gate_up")
    shapes = {name: tuple(p.shape) for name, p in layer.named_parameters()}
    assert shapes == {"qweight": (12, 16), "scales": (12,), "delta_a": (2, 16), "delta_b": (12, 2)}


def test_wrapping_refuses_a_method_that_is_not_a_wrapper_of_the_current_one():
    layer = MergedLinear(INPUT, OUTPUTS, prefix="mlp.gate_up")
    with pytest.raises(TypeError, match="mlp.gate_up: wrap must return a WrappedLinearMethod"):
        layer.wrap_linear_method(lambda base: UnquantizedLinearMethod())
    with pytest.raises(TypeError, match="whose base is the layer's UnquantizedLinearMethod"):
        layer.wrap_linear_method(lambda base: LowRankDelta(UnquantizedLinearMethod()))


class ReplacesWeight(WrappedLinearMethod):
    def add_weights(self, layer, partition, dtype):
        add_parameter(layer, "weight", (12, 16), dtype, default_weight_loader)


def test_a_wrapper_may_not_replace_the_bases_parameters():
    layer = MergedLinear(INPUT, OUTPUTS, prefix="mlp.gate_up")
    with pytest.raises(
        ValueError, match=r"ReplacesWeight replaced the base's parameters \['weight'\]"
    ):
        layer.wrap_linear_method(ReplacesWeight)
