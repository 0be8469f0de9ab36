"""compressed-tensors' "pack-quantized" W4A16 / W8A16 layers, held in core's packed layout.

Per checkpoint projection of N outputs and K inputs, with `bits` b, P = 32 / b values per
int32 word and groups of G inputs (G = K per channel):
- `weight_packed` int32 [N, K / P]: row n's values packed along the inputs, value w P + i
  of a row in bits i b .. (i + 1) b - 1 of its word w (from the least significant bits;
  `core.quantization.int32_packing`), each stored unsigned as u = q + 2^(b - 1), q the
  signed quantized value;
- `weight_scale` [N, K / G] (the model's dtype, usually);
- `weight_zero_point` int32 [N / P, K / G], asymmetric schemes only: the signed zero
  points z packed the same way, but along the outputs (symmetric: z = 0);
- `weight_shape` int [2]: [N, K], what the tensors' shapes already say here.

    W[n, k] = (q[n, k] - z[n, k // G]) * weight_scale[n, k // G]

After loading, a layer's W is held in core's group-quantized layout (core.quantization.
packed) and multiplied by core::quant_linear, as AWQ's and GGUF's weights are.
"""

from __future__ import annotations

import torch
from torch import nn

from core.quantization.compressed_tensors.scheme import GROUP_UNIT, Scheme
from core.quantization.int32_packing import unpack_int32
from core.quantization.interface import LinearMethod, LinearPartition
from core.quantization.packed import PackedWeight, drop_parameters, store, stored
from core.quantization.weight_loader import (
    ShardId,
    add_parameter,
    fused_weight_loader,
    set_shard_dims,
)

_WORD_BITS = 32
_CHECKPOINT_PARAMS = ("weight_packed", "weight_scale", "weight_shape")
_ZERO_POINT = "weight_zero_point"


class PackQuantizedLinearMethod(LinearMethod):
    """The parameters of the module docstring, one fused output per shard along their
    first dimension; replaced after loading by core's packed layout."""

    def __init__(self, scheme: Scheme, field: str) -> None:
        self.scheme = scheme
        self.field = field  # "config_groups.NAME.weights", for errors

    def create_weights(
        self,
        layer: nn.Module,
        partition: LinearPartition,
        bias: bool,
        dtype: torch.dtype,
    ) -> None:
        name = getattr(layer, "prefix", "") or "layer"
        inputs, sizes = partition.input_size_per_partition, partition.output_sizes_per_partition
        group = self._group_size(inputs, name)
        per_word = _WORD_BITS // self.scheme.num_bits
        rows, groups = sum(sizes), inputs // group
        loader = fused_weight_loader(sizes)
        packed = add_parameter(
            layer, "weight_packed", (rows, inputs // per_word), torch.int32, loader
        )
        set_shard_dims(packed, 0, 1, input_unit=per_word)
        # A channel's one scale covers a row-parallel rank's inputs as it covers all of them.
        group_dim = None if self.scheme.group_size is None else 1
        scale = add_parameter(layer, "weight_scale", (rows, groups), torch.float32, loader)
        set_shard_dims(scale, 0, group_dim, input_unit=group)
        if not self.scheme.symmetric:
            zero_rows = _zero_point_rows(sizes, per_word, name)
            zeros = add_parameter(layer, _ZERO_POINT, (sum(zero_rows), groups), torch.int32,
                                  fused_weight_loader(zero_rows))  # fmt: skip
            set_shard_dims(zeros, 0, group_dim, output_unit=per_word, input_unit=group)
        shape = add_parameter(layer, "weight_shape", (2,), torch.int64, _check_shape)
        set_shard_dims(shape, None, None)  # the same on every rank
        if bias:
            set_shard_dims(add_parameter(layer, "bias", (rows,), dtype, loader), 0, None)

    def _group_size(self, inputs: int, name: str) -> int:
        """G for a layer of `inputs` inputs; ValueError naming the layer and the field."""
        group = self.scheme.group_size or inputs
        if inputs % group:
            raise ValueError(
                f"{name}: {self.field}.group_size {group} does not divide in_features {inputs}"
            )
        unit = GROUP_UNIT[self.scheme.num_bits]
        if group % unit:
            raise ValueError(
                f"{name}: {self.scheme.name} per channel needs in_features a multiple of "
                f"{unit} (core's packed layout), got {inputs}"
            )
        return group

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        bits = self.scheme.num_bits
        stored_values = unpack_int32(layer.weight_packed, bits, dim=1)  # [N, K] u = q + 2^(b-1)
        scales = layer.weight_scale  # float32 [N, groups]
        if self.scheme.symmetric:
            stored_zeros = torch.full_like(scales, 2 ** (bits - 1))
        else:
            stored_zeros = unpack_int32(layer.weight_zero_point, bits, dim=0).float()
        # Both are offset by 2^(bits - 1) as stored, which (u - uz) cancels.
        store(layer, PackedWeight.from_zero_points(stored_values, stored_zeros, scales, bits))
        names = _CHECKPOINT_PARAMS if self.scheme.symmetric else (*_CHECKPOINT_PARAMS, _ZERO_POINT)
        drop_parameters(layer, names)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        out = stored(layer).matmul(x)
        return out if bias is None else out + bias

    def packed_weight(self, layer: nn.Module) -> PackedWeight | None:
        return stored(layer)

    def dequantize(self, layer: nn.Module) -> torch.Tensor:
        return stored(layer).dequantize().to(layer.params_dtype)


def _zero_point_rows(sizes: tuple[int, ...], per_word: int, name: str) -> list[int]:
    """The rows of each fused output's packed zero points (`per_word` outputs a word)."""
    if any(size % per_word for size in sizes):
        raise ValueError(
            f"{name}: zero points pack {per_word} outputs per int32; output sizes {sizes}"
        )
    return [size // per_word for size in sizes]


def _check_shape(param: nn.Parameter, loaded: torch.Tensor, shard_id: ShardId = None) -> None:
    """`weight_shape` is [N, K] of the checkpoint projection: the packed tensors' shapes
    (checked by their loaders) already say it, so only its form is checked; nothing kept."""
    if tuple(loaded.shape) != (2,):
        raise ValueError(f"weight_shape holds [outputs, inputs], got shape {tuple(loaded.shape)}")
