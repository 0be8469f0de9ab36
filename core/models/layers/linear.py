"""Linear layers whose weights and matmul belong to a LinearMethod (quantization seam).

The layer fixes the shape (input size, fused output sizes), which dimension tensor
parallelism splits, and the names of its fused shards; the LinearMethod its
QuantizationConfig picks creates the parameters and does the matmul. Each parameter's
`weight_loader` accepts the layer's own shard ids ("q", "k", "v" for QKVLinear; 0, 1 for
MergedLinear) and hands the method's loader the shard's index into `output_sizes`; shard
None (a tensor for the whole parameter) passes through for the method's loader to judge.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import ClassVar

import torch
from torch import nn

from core.quantization.interface import (
    LinearMethod,
    LinearPartition,
    LinearSplit,
    QuantizationConfig,
    WrappedLinearMethod,
)
from core.quantization.unquantized import UnquantizedLinearMethod
from core.quantization.weight_loader import ShardId, WeightLoader, set_weight_loader


class LinearBase(nn.Module):
    """y = x W^T + b, W of logical shape [sum(output_sizes), input_size].

    `prefix` is the module's name in the model (e.g. "model.layers.0.mlp.down_proj"), the
    name the QuantizationConfig is asked about. `partition` is the part of W this rank
    holds; tensor parallelism is not built yet (the platforms refuse
    --tensor-parallel-size above 1), so every layer is rank 0 of 1 and holds all of W.
    """

    def __init__(
        self,
        input_size: int,
        output_sizes: list[int],
        split: LinearSplit,
        bias: bool,
        quant_config: QuantizationConfig | None,
        prefix: str,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.partition = LinearPartition(input_size, tuple(output_sizes), split)
        self.params_dtype = dtype
        self.prefix = prefix
        self.register_parameter("bias", None)  # the method replaces it when bias is true
        self.linear_method: LinearMethod = (
            quant_config.get_linear_method(prefix)
            if quant_config is not None
            else UnquantizedLinearMethod()
        )
        self.linear_method.create_weights(self, self.partition, bias, dtype)
        self._translate_shard_ids(self.parameters(recurse=False))

    def wrap_linear_method(self, wrap: Callable[[LinearMethod], WrappedLinearMethod]) -> None:
        """Replace the layer's method by `wrap(method)`, a wrapper around the current one.

        The wrapper's `add_weights` registers its parameters now, beside the base's
        (which keep their values); their loaders take this layer's shard ids like the
        base's. Wrap after the checkpoint is loaded (the model's `load_weights` expects a
        checkpoint tensor for every parameter it has). Wrapping again stacks: the new
        wrapper's base is the old one.
        """
        method = wrap(self.linear_method)
        if not isinstance(method, WrappedLinearMethod) or method.base is not self.linear_method:
            raise TypeError(
                f"{self.prefix}: wrap must return a WrappedLinearMethod whose base is the "
                f"layer's {type(self.linear_method).__name__}, got {type(method).__name__}"
            )
        before = dict(self.named_parameters(recurse=False))
        method.add_weights(self, self.partition, self.params_dtype)
        after = dict(self.named_parameters(recurse=False))
        replaced = [name for name, param in before.items() if after.get(name) is not param]
        if replaced:
            raise ValueError(
                f"{self.prefix}: {type(method).__name__} replaced the base's parameters "
                f"{replaced}; a wrapper adds parameters under new names"
            )
        self._translate_shard_ids(p for name, p in after.items() if name not in before)
        self.linear_method = method

    def shard_index(self, shard_id: int | str) -> int:
        """The index into `output_sizes` of the layer's shard `shard_id`."""
        raise ValueError(f"{self.prefix} is not fused, got shard {shard_id!r}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, input] -> [T, sum(outputs)]
        return self.linear_method.apply(self, x, self.bias)

    def _translate_shard_ids(self, params: Iterable[nn.Parameter]) -> None:
        for param in params:
            set_weight_loader(param, partial(_load_shard, param.weight_loader, self.shard_index))


class _SingleOutputLinear(LinearBase):
    """A linear layer with one output; subclasses say how tensor parallelism splits it."""

    split: ClassVar[LinearSplit]

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = False,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__(input_size, [output_size], self.split, bias, quant_config, prefix, dtype)


class ReplicatedLinear(_SingleOutputLinear):
    """A plain linear layer: one output, no shards, whole on every rank."""

    split = LinearSplit.REPLICATED


class RowParallelLinear(_SingleOutputLinear):
    """One output whose input dimension tensor parallelism splits (attention's o_proj,
    the MLP's down_proj): each rank multiplies its slice of x, and the partial outputs
    are summed across ranks (one rank today, so nothing to sum)."""

    split = LinearSplit.ROW


class MergedLinear(LinearBase):
    """Several projections of one input fused into one matmul (e.g. MLP gate and up),
    column-parallel: each rank computes its slice of every projection.

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
        super().__init__(
            input_size, output_sizes, LinearSplit.COLUMN, bias, quant_config, prefix, dtype
        )

    def shard_index(self, shard_id: int | str) -> int:
        num_shards = len(self.partition.output_sizes)
        if not isinstance(shard_id, int) or not 0 <= shard_id < num_shards:
            raise ValueError(f"{self.prefix}: shard id should be 0..{num_shards - 1}")
        return shard_id


class QKVLinear(LinearBase):
    """The attention's query, key and value projections fused: output [q | k | v],
    column-parallel.

    Shard ids "q", "k", "v". With grouped-query attention k and v have
    `num_kv_heads * head_dim` outputs each, q `num_heads * head_dim`; `q_size` and
    `kv_size` are this rank's.
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
        super().__init__(
            hidden_size,
            [q_size, kv_size, kv_size],
            LinearSplit.COLUMN,
            bias,
            quant_config,
            prefix,
            dtype,
        )
        self.q_size, self.kv_size, _ = self.partition.output_sizes_per_partition

    def shard_index(self, shard_id: int | str) -> int:
        if shard_id not in self._SHARDS:
            raise ValueError(f"{self.prefix}: shard id should be one of {self._SHARDS}")
        return self._SHARDS.index(shard_id)


def _load_shard(
    method_loader: WeightLoader,
    shard_index: Callable[[int | str], int],
    param: nn.Parameter,
    loaded: torch.Tensor,
    shard_id: ShardId = None,
) -> None:
    method_loader(param, loaded, None if shard_id is None else shard_index(shard_id))
