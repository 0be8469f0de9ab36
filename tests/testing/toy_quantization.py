"""Toy quantization methods the kit's own tests run it against (core registers none).

`ToyInt8Config`: int8 `qweight` with one `scales` entry per output row, loaded through
fused loaders; apply scales after the matmul, so it differs from its dequantized reference
only by rounding. `RolledScalesConfig` is broken: its apply uses each row's neighbour's
scale, which the kit must catch.
"""

from __future__ import annotations

import torch

from core.quantization import (
    LinearMethod,
    QuantizationConfig,
    add_parameter,
    fused_weight_loader,
)


class ToyInt8Method(LinearMethod):
    def create_weights(self, layer, partition, bias, dtype):
        outputs = partition.output_sizes_per_partition
        loader = fused_weight_loader(outputs)
        rows = sum(outputs)
        shape = (rows, partition.input_size_per_partition)
        add_parameter(layer, "qweight", shape, torch.int8, loader)
        add_parameter(layer, "scales", (rows,), dtype, loader)
        if bias:
            add_parameter(layer, "bias", (rows,), dtype, loader)

    def apply(self, layer, x, bias):
        out = (x @ layer.qweight.t().to(x.dtype)) * self.row_scales(layer)  # [T, rows]
        return out if bias is None else out + bias

    def dequantize(self, layer):
        return layer.qweight.to(layer.scales.dtype) * layer.scales[:, None]

    def row_scales(self, layer) -> torch.Tensor:
        return layer.scales


class RolledScalesMethod(ToyInt8Method):
    def row_scales(self, layer) -> torch.Tensor:
        return layer.scales.roll(1)  # the bug: row i takes row i - 1's scale


class ToyInt8Config(QuantizationConfig):
    name = "toy_int8"
    method = ToyInt8Method

    @classmethod
    def from_config(cls, hf_quant_config):
        if hf_quant_config.get("quant_method") != cls.name:
            raise ValueError(f"quant_method must be {cls.name!r}")
        return cls()

    def get_linear_method(self, layer_name):
        return self.method()


class RolledScalesConfig(ToyInt8Config):
    name = "rolled_scales"
    method = RolledScalesMethod
