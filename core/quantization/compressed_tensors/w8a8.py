"""compressed-tensors' W8A8 int8 layers ("int-quantized"): int8 weights per channel times
activations quantized to int8 per token as the layer runs.

Per checkpoint projection of N outputs and K inputs: `weight` int8 [N, K] and
`weight_scale` [N, 1], W[n, k] = weight_scale[n] * weight[n, k]. Each step quantizes x per
token (dynamic, symmetric: no activation scale is stored) and core::int8_linear sums the
int8 products exactly; on the CPU it runs the fastest of torch's int8 GEMMs on this
machine (core.quantization.int8_linear_cpu, chosen by timing at start). Under tensor
parallelism a row-parallel layer's rank quantizes its own slice of x's inputs (as vLLM's
ranks do), so its tokens' scales are those of the slice.
"""

from __future__ import annotations

import torch
from torch import nn

from core.ops.int8_linear import int8_linear, quantize_per_token
from core.quantization import int8_linear_cpu
from core.quantization.interface import LinearMethod, LinearPartition
from core.quantization.packed import drop_parameters
from core.quantization.weight_loader import add_parameter, fused_weight_loader, set_shard_dims


class W8A8LinearMethod(LinearMethod):
    """Parameters `weight` and `weight_scale` as the checkpoint stores them, one fused
    output per shard along their first dimension; after loading the scales are the float32
    buffer `int8_weight_scale` [N]."""

    def __init__(self) -> None:
        int8_linear_cpu.register()  # re-entrant: the CPU kernels the worker times

    def create_weights(
        self,
        layer: nn.Module,
        partition: LinearPartition,
        bias: bool,
        dtype: torch.dtype,
    ) -> None:
        sizes = partition.output_sizes_per_partition
        rows, loader = sum(sizes), fused_weight_loader(sizes)
        shape = (rows, partition.input_size_per_partition)
        set_shard_dims(add_parameter(layer, "weight", shape, torch.int8, loader), 0, 1)
        # A row's one scale covers a row-parallel rank's inputs as it covers all of them.
        scale = add_parameter(layer, "weight_scale", (rows, 1), torch.float32, loader)
        set_shard_dims(scale, 0, None)
        if bias:
            set_shard_dims(add_parameter(layer, "bias", (rows,), dtype, loader), 0, None)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        scales = layer.weight_scale.reshape(-1).contiguous()  # [N]
        drop_parameters(layer, ("weight_scale",))
        layer.register_buffer("int8_weight_scale", scales, persistent=False)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        out = int8_linear(x, layer.weight, layer.int8_weight_scale)
        return out if bias is None else out + bias

    def rounded_input(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        xq, x_scale = quantize_per_token(x)
        return (xq.float() * x_scale).to(x.dtype)

    def dequantize(self, layer: nn.Module) -> torch.Tensor:
        scales = layer.int8_weight_scale[:, None]  # [N, 1]
        return (layer.weight.float() * scales).to(layer.params_dtype)
