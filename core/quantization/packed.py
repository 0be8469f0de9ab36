"""A weight held in core's group-quantized layout, and how a layer stores and uses one.

Methods that keep weights quantized (AWQ on the CPU, GGUF) convert their checkpoint's
format into this layout (see `core.ops.quant_linear`) in `process_weights_after_loading`
and then share everything else: the matmul through `core::quant_linear` (the C++ kernel of
core-cpu-kernels when installed), the row lookup of an embedding, the dense reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from core.ops.quant_linear import (
    check_layout,
    dequantize,
    dequantize_rows,
    group_size,
    pack,
    quant_linear,
    unpack,
)

_BUFFERS = ("packed_qweight", "packed_scales", "packed_mins")


@dataclass(frozen=True)
class PackedWeight:
    """W [N, K] = scales * q + mins per group of `group_size` inputs (core.ops.quant_linear)."""

    qweight: torch.Tensor
    scales: torch.Tensor  # float32 [N, K / G]
    mins: torch.Tensor  # float32 [N, K / G]
    bits: int

    @property
    def group_size(self) -> int:
        return group_size(self.qweight, self.scales, self.bits)

    @classmethod
    def from_zero_points(
        cls,
        q: torch.Tensor,  # [N, K] unsigned values, 0 .. 2^bits - 1
        zeros: torch.Tensor,  # [N, K / G] zero points, on q's scale
        scales: torch.Tensor,  # [N, K / G]
        bits: int,
    ) -> PackedWeight:
        """W = (q - z) * s, as GPTQ, AWQ and compressed-tensors store weights, in this
        layout. Its 4-bit values are unsigned and its 8-bit ones signed, so q' = q - c with
        c = 0 or 128, and min = (c - z) * s: both products, and their sum, are exact in
        float32 for scales of up to 16 significant bits (float16 and bfloat16 ones, what
        checkpoints store), so W is the checkpoint's to the bit."""
        centre = 0 if bits == 4 else 128
        scales = scales.float().contiguous()
        return cls(pack(q - centre, bits), scales, (centre - zeros.float()) * scales, bits)

    def check(self, name: str) -> None:
        """ValueError naming `name` when the tensors are not one packed weight."""
        check_layout(self.qweight, self.scales, self.mins, self.bits, name)

    def dequantize(self) -> torch.Tensor:  # [N, K] float32
        return dequantize(self.qweight, self.scales, self.mins, self.bits)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:  # [T, K] -> [T, N], x's dtype
        return quant_linear(x, self.qweight, self.scales, self.mins, self.bits)

    def rows(self, token_ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, K] float32
        return dequantize_rows(token_ids, self.qweight, self.scales, self.mins, self.bits)

    def converted(self, bits: int, group_size: int) -> PackedWeight:
        """The same W with at least `bits` per value and groups of `group_size` (which
        must divide this weight's group size): exact, only wider."""
        if bits < self.bits or self.group_size % group_size:
            raise ValueError(
                f"cannot hold {self.bits}-bit groups of {self.group_size} as {bits}-bit "
                f"groups of {group_size}"
            )
        repeat = self.group_size // group_size
        qweight = self.qweight
        if bits != self.bits:
            qweight = pack(unpack(qweight, self.bits), bits)
        scales = self.scales.repeat_interleave(repeat, dim=1)
        mins = self.mins.repeat_interleave(repeat, dim=1)
        return PackedWeight(qweight, scales, mins, bits)


def concat_rows(weights: Sequence[PackedWeight]) -> PackedWeight:
    """Fused shards stacked along N, first brought to the widest bits and the smallest
    group size among them (exact; `PackedWeight.converted`)."""
    bits = max(w.bits for w in weights)
    group = min(w.group_size for w in weights)
    same = [w.converted(bits, group) for w in weights]
    return PackedWeight(
        torch.cat([w.qweight for w in same]),
        torch.cat([w.scales for w in same]),
        torch.cat([w.mins for w in same]),
        bits,
    )


def store(layer: nn.Module, weight: PackedWeight) -> None:
    """Hold `weight` on `layer` as buffers (they follow the layer across devices).

    ValueError naming the layer (its `prefix`) when the tensors are not one packed weight:
    a method's conversion fails at load, not in the kernel.
    """
    weight.check(getattr(layer, "prefix", type(layer).__name__))
    for name, tensor in zip(_BUFFERS, (weight.qweight, weight.scales, weight.mins), strict=True):
        layer.register_buffer(name, tensor.contiguous(), persistent=False)
    layer.packed_bits = weight.bits


def stored(layer: nn.Module) -> PackedWeight | None:
    """The weight `store` put on `layer`, or None."""
    bits = getattr(layer, "packed_bits", None)
    if bits is None:
        return None
    qweight, scales, mins = (getattr(layer, name) for name in _BUFFERS)
    return PackedWeight(qweight, scales, mins, bits)


def drop_parameters(layer: nn.Module, names: Sequence[str]) -> None:
    """Remove checkpoint-format parameters a packed copy replaced (frees their memory)."""
    for name in names:
        delattr(layer, name)
