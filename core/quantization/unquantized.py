"""The reference LinearMethod: a plain weight matrix and F.linear.

Every other method is held to this one: a method's `apply` must compute, up to
rounding, what this method's `apply` computes with the dense W the method's `dequantize`
returns as its `weight`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from core.ops import linear
from core.quantization.interface import LinearMethod, LinearPartition
from core.quantization.weight_loader import add_parameter, fused_weight_loader, set_shard_dims


class UnquantizedLinearMethod(LinearMethod):
    """The reference: `weight` [sum(output_sizes), input_size] per partition and an
    optional `bias`, both in the activation dtype; `dequantize` is `weight` itself."""

    def create_weights(
        self,
        layer: nn.Module,
        partition: LinearPartition,
        bias: bool,
        dtype: torch.dtype,
    ) -> None:
        output_sizes = partition.output_sizes_per_partition
        loader = fused_weight_loader(output_sizes)
        output_size = sum(output_sizes)
        shape = (output_size, partition.input_size_per_partition)
        set_shard_dims(add_parameter(layer, "weight", shape, dtype, loader), 0, 1)
        if bias:
            set_shard_dims(add_parameter(layer, "bias", (output_size,), dtype, loader), 0, None)

    def apply(
        self,
        layer: nn.Module,
        x: torch.Tensor,  # [num_tokens, input_size]
        bias: torch.Tensor | None,
    ) -> torch.Tensor:  # [num_tokens, sum(output_sizes)]
        return dense_linear(x, layer.weight, bias)

    def dequantize(self, layer: nn.Module) -> torch.Tensor:
        return layer.weight

    def embed(self, layer: nn.Module, token_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(token_ids, layer.weight)


def dense_linear(
    x: torch.Tensor,  # [N, input_size]
    weight: torch.Tensor,  # [output_size, input_size]
    bias: torch.Tensor | None = None,
) -> torch.Tensor:  # [N, output_size]
    """x @ weight.T + bias through `core::linear` (the kernel serving x's device type)."""
    return linear(x, weight, bias)
