"""Linear layers whose weights and matmul belong to a LinearMethod (quantization seam).

The layer fixes the shape (input size, fused output sizes) and the names of its fused
shards; the LinearMethod its QuantizationConfig picks creates the parameters and does
the matmul. Each parameter's `weight_loader` accepts the layer's own shard ids ("q",
"k", "v" for QKVLinear; 0, 1 for MergedLinear) and hands the method's loader the shard's
index into `output_sizes`.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import nn

from core.quantization.interface import LinearMethod, QuantizationConfig
from core.quantization.unquantized import UnquantizedLinearMethod
from core.quantization.weight_loader import ShardId, WeightLoader, set_weight_loader


class LinearBase(nn.Module):
    """y = x W^T + b, W of logical shape [sum(output_sizes), input_size].

    `prefix` is the module's name in the model (e.g. "model.layers.0.mlp.down_proj"), the
    name the QuantizationConfig is asked about.
    """

    def __init__(
        self,
        input_size: int,
        output_sizes: list[int],
        bias: bool,
        quant_config: QuantizationConfig | None,
        prefix: str,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.input_size = input_size
        self.output_sizes = list(output_sizes)
        self.prefix = prefix
        self.register_parameter("bias", None)  # the method replaces it when bias is true
        self.linear_method: LinearMethod = (
            quant_config.get_linear_method(prefix)
            if quant_config is not None
            else UnquantizedLinearMethod()
        )
        self.linear_method.create_weights(self, input_size, self.output_sizes, bias, dtype)
        for param in self.parameters(recurse=False):
            set_weight_loader(param, partial(_load_shard, param.weight_loader, self.shard_index))

    def shard_index(self, shard_id: ShardId) -> int | None:
        """The index into `output_sizes` of the layer's shard `shard_id` (None: whole)."""
        if shard_id is not None:
            raise ValueError(f"{self.prefix} is not fused, got shard {shard_id!r}")
        return None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, input] -> [T, sum(outputs)]
        return self.linear_method.apply(self, x, self.bias)


class ReplicatedLinear(LinearBase):
    """A plain linear layer: one output, no shards."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = False,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__(input_size, [output_size], bias, quant_config, prefix, dtype)


class MergedLinear(LinearBase):
    """Several projections of one input fused into one matmul (e.g. MLP gate and up).

    Shard ids are the positions in `output_sizes`: 0, 1, ...
    """

    def __init__(
        self,
        input_size: int,
        output_sizes: list[int],
        bias: bool = False,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__(input_size, output_sizes, bias, quant_config, prefix, dtype)

    def shard_index(self, shard_id: ShardId) -> int | None:
        if not isinstance(shard_id, int) or not 0 <= shard_id < len(self.output_sizes):
            raise ValueError(f"{self.prefix}: shard id should be 0..{len(self.output_sizes) - 1}")
        return shard_id


class QKVLinear(LinearBase):
    """The attention's query, key and value projections fused: output [q | k | v].

    Shard ids "q", "k", "v". With grouped-query attention k and v have
    `num_kv_heads * head_dim` outputs each, q `num_heads * head_dim`.
    """

    _SHARDS = ("q", "k", "v")

    def __init__(
        self,
        hidden_size: int,
        head_dim: int,
        num_heads: int,
        num_kv_heads: int,
        bias: bool = False,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
        super().__init__(hidden_size, [q_size, kv_size, kv_size], bias, quant_config, prefix, dtype)
        self.q_size = q_size
        self.kv_size = kv_size

    def shard_index(self, shard_id: ShardId) -> int | None:
        if shard_id not in self._SHARDS:
            raise ValueError(f"{self.prefix}: shard id should be one of {self._SHARDS}")
        return self._SHARDS.index(shard_id)


def _load_shard(
    method_loader: WeightLoader,
    shard_index: Callable[[ShardId], int | None],
    param: nn.Parameter,
    loaded: torch.Tensor,
    shard_id: ShardId = None,
) -> None:
    method_loader(param, loaded, shard_index(shard_id))
