"""LoRALinearMethod: a linear layer's method plus the low-rank deltas of adapter slots.

It wraps whatever method the layer has (unquantized, AWQ, GGUF: `WrappedLinearMethod`), so
the base matmul runs once for all token rows, as before; then each row gets
`(x @ A[s]^T) @ B[s]^T`, A and B of the adapter in the row's slot s (scaling folded into B).

Each slot holds one adapter's weights for every shard of the layer (q, k, v of a fused
QKV layer), zero-padded to `max_rank` per shard, as two stacked buffers:
`lora_a` [max_loras * W, input] and `lora_b` [max_loras * W, output], W = shards * max_rank,
where rows j*max_rank.. of a slot are shard j's A rows and B columns, and B is zero outside
shard j's output columns. Under tensor parallelism a slot holds the rank's part: the
rank's rows of B for a column-parallel layer, its columns of A for a row-parallel one
(whose partial deltas the layer's all-reduce sums with the base's). One matmul shrinks
every token against every used slot, the
other slots' columns of each token are set to zero (set, not multiplied by a 0/1 mask: a slot
whose values overflow to inf would otherwise turn every co-batched row into NaN, 0 x inf),
one matmul expands: three kernels per layer whatever the mix of adapters (the CPU path; on
CUDA the Triton kernels read each token's slot directly).
"""

from __future__ import annotations

import itertools

import torch
from torch import nn

from core.forward_context import get_forward_context
from core.models.layers.linear import LinearBase
from core.quantization.interface import (
    LinearMethod,
    LinearPartition,
    LinearSplit,
    WrappedLinearMethod,
)
from core_lora.adapter import LoRAWeights
from core_lora.mapping import SlotMapping

__all__ = ["LoRALinearMethod"]


class LoRALinearMethod(WrappedLinearMethod):
    def __init__(self, base: LinearMethod, num_slots: int, max_rank: int) -> None:
        super().__init__(base)
        self.num_slots = num_slots
        self.max_rank = max_rank

    def add_weights(self, layer: nn.Module, partition: LinearPartition, dtype: torch.dtype) -> None:
        """The slot buffers, zero (every slot empty), on the device of the base's weights."""
        device = next(itertools.chain(layer.parameters(), layer.buffers())).device
        self.output_sizes = partition.output_sizes_per_partition
        width = len(self.output_sizes) * self.max_rank
        rows = self.num_slots * width
        a = torch.zeros(rows, partition.input_size_per_partition, dtype=dtype, device=device)
        b = torch.zeros(rows, sum(self.output_sizes), dtype=dtype, device=device)
        # Not persistent: adapters come and go; they are never part of the model's state.
        layer.register_buffer("lora_a", a, persistent=False)
        layer.register_buffer("lora_b", b, persistent=False)

    @property
    def width(self) -> int:
        """Rows of `lora_a` (and of `lora_b`) per slot."""
        return len(self.output_sizes) * self.max_rank

    def set_slot(self, layer: nn.Module, slot: int, shards: dict[int, LoRAWeights]) -> None:
        """Put an adapter's weights for this layer ({shard index: A, B}) in `slot`; shards
        it does not adapt (and a layer it does not adapt at all: `{}`) contribute zero."""
        a, b = self._slot_rows(layer, slot)
        a.zero_()
        b.zero_()
        for shard, weights in shards.items():
            shard_a, shard_b = _rank_part(layer, shard, weights)
            rank = shard_a.shape[0]
            rows = slice(shard * self.max_rank, shard * self.max_rank + rank)
            start = sum(self.output_sizes[:shard])
            a[rows] = shard_a
            b[rows, start : start + self.output_sizes[shard]] = shard_b.T

    def delta_weight(self, layer: nn.Module, slot: int) -> torch.Tensor:
        """[output, input]: what the adapter in `slot` adds to the layer's W (the dense
        reference of a row in that slot: `dequantize(layer) + delta_weight(layer, slot)`)."""
        a, b = self._slot_rows(layer, slot)
        return b.T.float() @ a.float()

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        y = self.base.apply(layer, x, bias)
        mapping: SlotMapping | None = get_forward_context().lora_mapping
        if mapping is None or not mapping.active:
            return y
        width = self.width
        rows = slice(mapping.first * width, mapping.end * width)
        if x.is_cuda:
            return self._apply_triton(layer, x, y, mapping)
        shrunk = x @ layer.lora_a[rows].T  # [T, used slots * width]
        shrunk.masked_fill_(mapping.foreign(width), 0.0)
        return y.addmm_(shrunk, layer.lora_b[rows])

    def _apply_triton(
        self, layer: nn.Module, x: torch.Tensor, y: torch.Tensor, mapping: SlotMapping
    ) -> torch.Tensor:
        from core_lora.triton_lora import lora_apply

        a = layer.lora_a.view(self.num_slots, self.width, -1)
        b = layer.lora_b.view(self.num_slots, self.width, -1)
        lora_apply(x, a, b, mapping.token_slots, y)
        return y

    def _slot_rows(self, layer: nn.Module, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = slice(slot * self.width, (slot + 1) * self.width)
        return layer.lora_a[rows], layer.lora_b[rows]


def _rank_part(
    layer: LinearBase, shard: int, weights: LoRAWeights
) -> tuple[torch.Tensor, torch.Tensor]:
    """This tensor-parallel rank's A and B of one shard: B's rows of the rank's outputs in
    a column-parallel layer, A's columns of its inputs in a row-parallel one."""
    partition = layer.partition
    if partition.tp_size == 1 or partition.split is LinearSplit.REPLICATED:
        return weights.a, weights.b
    if partition.split is LinearSplit.COLUMN:
        start, length = layer.checkpoint_rows(shard)
        return weights.a, weights.b[start : start + length]
    length = partition.input_size_per_partition
    start = partition.tp_rank * length
    return weights.a[:, start : start + length], weights.b
