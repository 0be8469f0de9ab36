"""The quantization extension point: how a linear layer stores its weights and multiplies.

A checkpoint's quantization method (its `quantization_config.quant_method`, or
`--quantization`) names a `QuantizationConfig` class registered in the
`core.quantization` entry-point group. The model asks that config, per linear layer, for
a `LinearMethod`; the method creates the layer's parameters and performs its matmul, so a
plugin (AWQ, GPTQ, FP8...) swaps both without the model code knowing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch
from torch import nn

__all__ = ["LinearMethod", "QuantizationConfig"]


class LinearMethod(ABC):
    """Weight creation and matmul of one linear layer.

    A linear layer computes y = x W^T + b with W of logical shape
    [sum(output_sizes), input_size]. `output_sizes` lists the fused outputs stacked along
    the output dimension (q, k, v for a fused attention projection; gate, up for a fused
    MLP; a single size otherwise); the layer's output is their concatenation in order.
    """

    @abstractmethod
    def create_weights(
        self,
        layer: nn.Module,
        input_size: int,
        output_sizes: list[int],
        bias: bool,
        dtype: torch.dtype,
    ) -> None:
        """Register the layer's parameters on `layer` (`layer.register_parameter`).

        Contract:
        - Parameter names are the checkpoint's suffixes for this method ("weight" for
          unquantized; e.g. "qweight", "qzeros", "scales" for AWQ): the model loads the
          checkpoint tensor `<layer prefix>.<name>` into the parameter `<name>`.
        - Every parameter carries a `weight_loader(param, loaded, shard_id)` attribute
          (`core.quantization.weight_loader.set_weight_loader`). `shard_id` is the index
          into `output_sizes` of the fused output the checkpoint tensor holds, or None
          for a tensor covering the whole parameter. `fused_weight_loader` implements
          the common case of shards stacked along one dimension.
        - When `bias` is true, register a parameter named "bias" of shape
          [sum(output_sizes)] in `dtype`; `apply` receives it. Otherwise register none:
          the layer has already set `layer.bias` to None.
        - Parameters are created with requires_grad=False (inference only) on the
          current default device; `dtype` is the model's activation dtype.
        """

    @abstractmethod
    def apply(
        self,
        layer: nn.Module,
        x: torch.Tensor,  # [num_tokens, input_size], the model's dtype
        bias: torch.Tensor | None,  # [sum(output_sizes)]
    ) -> torch.Tensor:  # [num_tokens, sum(output_sizes)], the model's dtype
        """The layer's output for `x`, computed from the parameters `create_weights` made."""


class QuantizationConfig(ABC):
    """A quantization method and its settings, registered in `core.quantization`.

    `name` is the entry name (the checkpoint's `quant_method`). The engine builds one
    instance per model with `from_config` and passes it to the model class, which calls
    `get_linear_method` once per linear layer while it is constructed.
    """

    name: ClassVar[str]

    @classmethod
    @abstractmethod
    def from_config(cls, hf_quant_config: dict[str, Any]) -> QuantizationConfig:
        """Build from the checkpoint's `quantization_config` dict; ValueError naming a
        missing or unsupported field."""

    @abstractmethod
    def get_linear_method(self, layer_name: str) -> LinearMethod:
        """The method for the linear layer `layer_name` (its module prefix, e.g.
        "model.layers.0.self_attn.qkv_proj"); return an `UnquantizedLinearMethod` for
        layers the checkpoint leaves unquantized."""
