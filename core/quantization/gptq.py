"""GPTQ checkpoints (AutoGPTQ, GPTQModel) as a core quantization method, entry `gptq`.

A linear layer W [N outputs, K inputs] quantized to `bits` (4 or 8) in groups of G inputs
is stored as
- `qweight` int32 [K / P, N] (P = 32 / bits values per word), packed along the inputs from
  the least significant bits (`core.quantization.int32_packing`): q[k, n], unsigned;
- `qzeros` int32 [groups, N / P], packed along the outputs the same way: the zero points;
- `scales` float16 [groups, N];
- `g_idx` int32 [K]: the group of each input. k // G unless the checkpoint was quantized
  in activation order (`desc_act`), which assigns inputs to groups by that order;
and W[n, k] = scales[g_idx[k], n] * (q[k, n] - z[g_idx[k], n]). `checkpoint_format`
"gptq" (v1, the default) stores z - 1 (so a zero point of 0 cannot be written: every
reader takes the stored value plus one), "gptq_v2" stores z itself; symmetric
quantization stores z = 2^(bits - 1) like any other zero point. group_size -1 is one
group of all K inputs.

After loading, each layer is converted once into core's packed layout
(`core.quantization.packed`) and multiplied by `core::quant_linear` on any device (the C++
kernel of core-cpu-kernels on the CPU, the reference elsewhere). An act-order layer's
inputs are first sorted by group (stably), so that every group is a run of G inputs:
the layer keeps that order (`input_order`) and `apply` gathers x's columns into it.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import nn

from core.ops.quant_linear import group_unit
from core.quantization.int32_packing import unpack_int32
from core.quantization.interface import (
    LinearMethod,
    LinearPartition,
    LinearSplit,
    QuantizationConfig,
)
from core.quantization.packed import PackedWeight, drop_parameters, store, stored
from core.quantization.weight_loader import (
    ShardId,
    WeightLoader,
    add_parameter,
    default_weight_loader,
    fused_weight_loader,
    set_random_values,
    set_shard_dims,
)

__all__ = ["GPTQConfig", "GPTQLinearMethod"]

BITS = (4, 8)
ZERO_OFFSETS = {"gptq": 1, "gptq_v2": 0}
"""What each `checkpoint_format` adds to a stored zero point to get z."""
_CHECKPOINT_PARAMS = ("qweight", "qzeros", "scales", "g_idx")


class GPTQConfig(QuantizationConfig):
    """`quantization_config = {"quant_method": "gptq", "bits": 4 | 8, "group_size": G | -1,
    "desc_act": bool, "sym": bool, "checkpoint_format": "gptq" | "gptq_v2"}`.

    Keys it does not read are ignored, as vLLM does (`sym` among them: the zero points are
    stored either way). Refused, naming the key: a quantized LM head (`lm_head`) and
    GPTQModel's per-module overrides (`dynamic`).
    """

    name = "gptq"
    # Every layout splits but act order across a row-parallel layer's ranks, which
    # `create_weights` refuses (each rank's inputs would hold a ragged part of each group).
    tensor_parallel = True

    def __init__(self, bits: int, group_size: int, desc_act: bool, checkpoint_format: str) -> None:
        self.bits = bits
        self.group_size = group_size
        self.desc_act = desc_act
        self.checkpoint_format = checkpoint_format

    @classmethod
    def from_config(cls, hf_quant_config: dict[str, Any]) -> GPTQConfig:
        bits = _required(hf_quant_config, "bits")
        if bits not in BITS:
            raise ValueError(f"bits: GPTQ is read as 4- or 8-bit weights, got {bits!r}")
        group_size = _required(hf_quant_config, "group_size")
        unit = group_unit(bits)
        if group_size != -1 and (
            not isinstance(group_size, int) or group_size <= 0 or group_size % unit
        ):
            raise ValueError(
                f"group_size: -1 (one group) or a positive multiple of {unit} for {bits}-bit "
                f"weights, got {group_size!r}"
            )
        desc_act = hf_quant_config.get("desc_act", False)
        if not isinstance(desc_act, bool):
            raise ValueError(f"desc_act: true or false, got {desc_act!r}")
        checkpoint_format = hf_quant_config.get("checkpoint_format") or "gptq"
        if checkpoint_format not in ZERO_OFFSETS:
            raise ValueError(
                f"checkpoint_format: one of {sorted(ZERO_OFFSETS)}, got {checkpoint_format!r}"
            )
        _refuse_extensions(hf_quant_config)
        return cls(bits, group_size, desc_act, checkpoint_format)

    def get_linear_method(self, layer_name: str) -> LinearMethod:
        return GPTQLinearMethod(self)


class GPTQLinearMethod(LinearMethod):
    """Parameters `qweight`, `qzeros`, `scales`, `g_idx` as GPTQ stores them (fused
    outputs side by side along their last dimension; one `g_idx`, which every fused shard
    must share); replaced after loading by a packed weight and the input order."""

    def __init__(self, config: GPTQConfig) -> None:
        self.config = config

    def create_weights(
        self,
        layer: nn.Module,
        partition: LinearPartition,
        bias: bool,
        dtype: torch.dtype,
    ) -> None:
        config = self.config
        in_features = partition.input_size_per_partition
        sizes = partition.output_sizes_per_partition
        group = _check_layer(config, partition, getattr(layer, "prefix", "") or "layer")
        per_word = 32 // config.bits
        groups = in_features // group
        # One group (-1) spans every rank's inputs: each rank holds its scales and zeros whole.
        group_dim = 0 if config.group_size > 0 else None
        along_outputs = fused_weight_loader(sizes, output_dim=1)
        qweight_shape = (in_features // per_word, sum(sizes))
        qweight = add_parameter(layer, "qweight", qweight_shape, torch.int32, along_outputs)
        set_shard_dims(qweight, 1, 0, input_unit=per_word)
        packed_sizes = [size // per_word for size in sizes]
        zeros_loader = fused_weight_loader(packed_sizes, output_dim=1)
        qzeros = add_parameter(
            layer, "qzeros", (groups, sum(packed_sizes)), torch.int32, zeros_loader
        )
        set_shard_dims(qzeros, 1, group_dim, output_unit=per_word, input_unit=group)
        # float32 holds float16 and bfloat16 scales exactly, whichever the checkpoint has.
        scales = add_parameter(layer, "scales", (groups, sum(sizes)), torch.float32, along_outputs)
        set_shard_dims(scales, 1, group_dim, input_unit=group)
        _add_g_idx(layer, partition, config)
        if bias:
            loader = fused_weight_loader(sizes)
            set_shard_dims(add_parameter(layer, "bias", (sum(sizes),), dtype, loader), 0, None)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        bits = self.config.bits
        q = unpack_int32(layer.qweight, bits, dim=0).T  # [N, K]
        zeros = unpack_int32(layer.qzeros, bits, dim=1).T  # [N, groups]
        zeros = zeros + ZERO_OFFSETS[self.config.checkpoint_format]
        scales = layer.scales.T.contiguous()  # [N, groups] float32
        order = _input_order(layer.g_idx, q.shape[1] // scales.shape[1], layer.prefix)
        if order is not None:
            q = q[:, order]
        store(layer, PackedWeight.from_zero_points(q, zeros, scales, bits))
        drop_parameters(layer, _CHECKPOINT_PARAMS)
        layer.register_buffer("input_order", order, persistent=False)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if layer.input_order is not None:
            x = x[:, layer.input_order]  # [T, K] in the packed weight's input order
        out = _packed(layer).matmul(x)
        return out if bias is None else out + bias

    def packed_weight(self, layer: nn.Module) -> PackedWeight | None:
        return _packed(layer) if layer.input_order is None else None  # act-order reorders x

    def dequantize(self, layer: nn.Module) -> torch.Tensor:
        weight = _packed(layer).dequantize()  # [N, K] float32, in input_order
        if layer.input_order is not None:
            unsorted = torch.empty_like(weight)
            unsorted[:, layer.input_order] = weight
            weight = unsorted
        return weight.to(layer.params_dtype)


def _required(config: dict[str, Any], key: str) -> Any:
    if key not in config:
        raise ValueError(f"{key}: missing from the GPTQ quantization_config")
    return config[key]


def _refuse_extensions(config: dict[str, Any]) -> None:
    """ValueError naming a setting that asks for more than plain per-layer GPTQ."""
    if config.get("lm_head", False):
        raise ValueError("lm_head: a GPTQ-quantized LM head is not supported (true)")
    if config.get("dynamic"):
        raise ValueError("dynamic: GPTQModel's per-module overrides are not supported")
    if config.get("is_marlin_format", False):
        raise ValueError("is_marlin_format: AutoGPTQ's Marlin layout is not supported (true)")


def _check_layer(config: GPTQConfig, partition: LinearPartition, name: str) -> int:
    """This rank's group size, after ValueError naming the layer `name` when its shape
    does not fit the checkpoint's packing or core's packed layout."""
    in_features = partition.input_size_per_partition
    sizes = partition.output_sizes_per_partition
    per_word = 32 // config.bits
    if any(size % per_word for size in sizes):
        raise ValueError(f"{name}: GPTQ packs {per_word} outputs per int32; output sizes {sizes}")
    if config.group_size > 0 and in_features % config.group_size:
        raise ValueError(
            f"{name}: group_size {config.group_size} does not divide in_features {in_features}"
        )
    group = config.group_size if config.group_size > 0 else in_features
    if group % group_unit(config.bits):
        raise ValueError(
            f"{name}: group_size -1 makes one group of in_features {in_features}, not a "
            f"multiple of {group_unit(config.bits)}"
        )
    split_groups = partition.split is LinearSplit.ROW and partition.tp_size > 1
    if config.desc_act and config.group_size > 0 and split_groups:
        raise ValueError(
            f"{name}: desc_act (act-order groups) cannot be split across "
            f"{partition.tp_size} tensor-parallel ranks of a row-parallel layer"
        )
    return group


def _add_g_idx(layer: nn.Module, partition: LinearPartition, config: GPTQConfig) -> None:
    """Register `g_idx`: this rank's inputs, their groups counted from its first."""
    loader = _g_idx_loader(_first_group(partition, config.group_size))
    g_idx = add_parameter(
        layer, "g_idx", (partition.input_size_per_partition,), torch.int32, loader
    )
    set_shard_dims(g_idx, None, 0)
    group = config.group_size if config.group_size > 0 else partition.input_size
    make = partial(_checkpoint_g_idx, partition.input_size, group, config.desc_act)
    set_random_values(g_idx, make)


def _first_group(partition: LinearPartition, group_size: int) -> int:
    """The checkpoint's index of this rank's first group (`group_size` the checkpoint's):
    a row-parallel rank's inputs start partway through W's, but for the one group of -1."""
    if partition.split is not LinearSplit.ROW or group_size < 0:
        return 0
    return partition.tp_rank * partition.input_size_per_partition // group_size


def _g_idx_loader(first_group: int) -> WeightLoader:
    """A loader of `g_idx` counting groups from this rank's first, for every fused shard:
    one layer multiplies its inputs in one order, so later shards must repeat the first's."""
    loaded_shards: set[int] = set()

    def load(param: nn.Parameter, loaded: torch.Tensor, shard_id: ShardId = None) -> None:
        shard = 0 if shard_id is None else shard_id
        local = loaded - first_group
        if loaded_shards - {shard}:
            if not torch.equal(param.data, local.to(param.data)):
                raise ValueError(
                    f"g_idx of shard {shard} differs from that of shards "
                    f"{sorted(loaded_shards)}: their inputs were quantized in different orders"
                )
        else:
            default_weight_loader(param, local)
        loaded_shards.add(shard)

    return load


def _checkpoint_g_idx(
    num_inputs: int, group: int, act_order: bool, generator: torch.Generator
) -> torch.Tensor:
    """A valid random checkpoint g_idx (G inputs per group), for tests and the kit. Act
    order permutes with its own fixed seed, not `generator`: fused shards share one order."""
    groups = torch.arange(num_inputs, dtype=torch.int32) // group
    if not act_order:
        return groups
    return groups[torch.randperm(num_inputs, generator=torch.Generator().manual_seed(0))]


def _input_order(g_idx: torch.Tensor, group: int, name: str) -> torch.Tensor | None:
    """The input permutation that makes each group a contiguous run of `group` inputs
    (a stable sort by group); None when the inputs are in that order already."""
    order = torch.argsort(g_idx, stable=True)
    positions = torch.arange(len(g_idx), device=g_idx.device)
    if not torch.equal(g_idx[order].long(), positions // group):
        raise ValueError(f"{name}: g_idx does not put {group} inputs in each group")
    return None if torch.equal(order, positions) else order


def _packed(layer: nn.Module) -> PackedWeight:
    packed = stored(layer)
    if packed is None:
        raise RuntimeError(f"{layer.prefix}: GPTQ weights are used before they were processed")
    return packed
