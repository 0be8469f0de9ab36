"""Linear layers whose weights and matmul belong to a LinearMethod (quantization seam).

The layer fixes the shape (input size, fused output sizes), which dimension tensor
parallelism splits, and the names of its fused shards; the LinearMethod its
QuantizationConfig picks creates the parameters and does the matmul. Each parameter's
`weight_loader` accepts the layer's own shard ids ("q", "k", "v" for QKVLinear; 0, 1 for
MergedLinear) and hands the method's loader the shard's index into `output_sizes`; shard
None (a tensor for the whole parameter) passes through for the method's loader to judge.

Under tensor parallelism (core.distributed.parallel_state) each layer holds its rank's
partition and its loaders cut this rank's slice out of every checkpoint tensor, along the
dimensions the method declared (`set_shard_dims`), before the method's loader sees it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import ClassVar

import torch
from torch import nn

from core.distributed.parallel_state import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    get_tp_group,
)
from core.quantization.interface import (
    LinearMethod,
    LinearPartition,
    LinearSplit,
    QuantizationConfig,
    WrappedLinearMethod,
)
from core.quantization.unquantized import UnquantizedLinearMethod
from core.quantization.weight_loader import (
    ShardId,
    WeightLoader,
    get_shard_dims,
    set_weight_loader,
)


class LinearBase(nn.Module):
    """y = x W^T + b, W of logical shape [sum(output_sizes), input_size].

    `prefix` is the module's name in the model (e.g. "model.layers.0.mlp.down_proj"), the
    name the QuantizationConfig is asked about. `partition` is the part of W this rank
    holds: the tensor-parallel rank and size of the process (0 of 1 without one).
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
        self.partition = LinearPartition(
            input_size,
            tuple(output_sizes),
            split,
            get_tensor_model_parallel_rank(),
            get_tensor_model_parallel_world_size(),
        )
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

    @property
    def checkpoint_output_sizes(self) -> tuple[int, ...]:
        """The output sizes of the checkpoint's tensors of each shard (the partition's,
        but for KV heads replicated across ranks, which the checkpoint holds once)."""
        return self.partition.output_sizes

    def checkpoint_rows(self, shard: int) -> tuple[int, int]:
        """(start, length) of this rank's rows in the checkpoint tensor of output `shard`
        (a column-parallel layer): its equal share."""
        length = self.partition.output_sizes_per_partition[shard]
        return self.partition.tp_rank * length, length

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, input] -> [T, sum(outputs)]
        return self.linear_method.apply(self, x, self.bias)

    def lean(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """`forward` as a closure (core.models.lean_step); the linear method is looked up
        at each call, so one wrapped after this was made (LoRA) still applies."""
        bias = self.bias
        return lambda x: self.linear_method.apply(self, x, bias)

    def _translate_shard_ids(self, params: Iterable[nn.Parameter]) -> None:
        for param in params:
            set_weight_loader(param, partial(_load_shard, param.weight_loader, self))


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
    are summed across ranks; the bias is added once (by rank 0, before the sum)."""

    split = LinearSplit.ROW

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, input / tp] -> [T, output]
        if self.partition.tp_size == 1:
            return self.linear_method.apply(self, x, self.bias)
        bias = self.bias if self.partition.tp_rank == 0 else None
        return get_tp_group().all_reduce(self.linear_method.apply(self, x, bias))

    def lean(self) -> Callable[[torch.Tensor], torch.Tensor]:
        return super().lean() if self.partition.tp_size == 1 else self


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
    `kv_size` are this rank's. With fewer KV heads than tensor-parallel ranks each KV head
    is replicated on `tp_size / num_kv_heads` consecutive ranks (every rank holds one).
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
        tp_size = get_tensor_model_parallel_world_size()
        self.head_dim = head_dim
        self.kv_head_replicas = max(tp_size // num_kv_heads, 1)
        # k and v as the partition sees them: the replicated heads count once per rank.
        q_size, kv_size = num_heads * head_dim, num_kv_heads * self.kv_head_replicas * head_dim
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

    @property
    def checkpoint_output_sizes(self) -> tuple[int, ...]:
        q_size, kv_size, _ = self.partition.output_sizes
        kv_size //= self.kv_head_replicas
        return q_size, kv_size, kv_size

    def checkpoint_rows(self, shard: int) -> tuple[int, int]:
        if shard == 0 or self.kv_head_replicas == 1:
            return super().checkpoint_rows(shard)
        head = self.partition.tp_rank // self.kv_head_replicas
        return head * self.head_dim, self.head_dim


def rank_slice(
    partition: LinearPartition,
    param: nn.Parameter,
    loaded: torch.Tensor,
    rows: tuple[int, int],
    owner: str,
) -> torch.Tensor:
    """This rank's part of the checkpoint tensor `loaded` for `param`: `rows` (start,
    length) along the output dimension of a column-parallel layer, the rank's share of
    the input dimension of a row-parallel one; all of it with one rank or a replicated
    layer. ValueError naming `owner` when the method did not say how to cut `param`."""
    if partition.tp_size == 1 or partition.split is LinearSplit.REPLICATED:
        return loaded
    dims = get_shard_dims(param)
    if dims is None:
        raise ValueError(
            f"{owner}: its weights cannot be split across {partition.tp_size} tensor-parallel "
            "ranks (the method does not say along which dimensions)"
        )
    if partition.split is LinearSplit.COLUMN:
        if dims.output_dim is None:
            return loaded
        return _narrow(loaded, dims.output_dim, rows, dims.output_unit, owner)
    if dims.input_dim is None:
        return loaded  # e.g. a row-parallel layer's bias: whole on every rank
    length = partition.input_size_per_partition
    inputs = (partition.tp_rank * length, length)
    return _narrow(loaded, dims.input_dim, inputs, dims.input_unit, owner)


def _narrow(
    loaded: torch.Tensor, dim: int, span: tuple[int, int], unit: int, owner: str
) -> torch.Tensor:
    """`loaded` along `dim` over W's [start, start + length), `unit` of W per element."""
    start, length = span
    if start % unit or length % unit:
        raise ValueError(
            f"{owner}: a rank's share ({length} from {start}) is not a whole number of "
            f"{unit}-wide packed elements or groups"
        )
    return loaded.narrow(dim, start // unit, length // unit)


def _load_shard(
    method_loader: WeightLoader,
    layer: LinearBase,
    param: nn.Parameter,
    loaded: torch.Tensor,
    shard_id: ShardId = None,
) -> None:
    shard = None if shard_id is None else layer.shard_index(shard_id)
    rows = layer.checkpoint_rows(0 if shard is None else shard)
    loaded = rank_slice(layer.partition, param, loaded, rows, layer.prefix)
    method_loader(param, loaded, shard)
