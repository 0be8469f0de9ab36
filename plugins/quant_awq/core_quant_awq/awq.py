"""AWQ (activation-aware 4-bit weights) as a core quantization method, entry `awq`.

Reads AutoAWQ "gemm" checkpoints (see `awq_format`). On the CPU each layer is repacked
after loading into core's group-quantized layout and multiplied by `core::quant_linear`
(the C++ kernel of core-cpu-kernels when installed); on a CUDA device it stays in
AutoAWQ's layout and the Triton kernel of `triton_awq` multiplies it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from core.model_loader.checkpoint import Checkpoint
from core.quantization import (
    LinearMethod,
    LinearPartition,
    QuantizationConfig,
    UnquantizedLinearMethod,
    add_parameter,
    fused_weight_loader,
    set_shard_dims,
)
from core.quantization.packed import PackedWeight, drop_parameters, store, stored
from core_quant_awq import awq_format

_RUN = 32  # core's 4-bit layout packs runs of 32 inputs: AWQ groups must hold whole runs
_CHECKPOINT_PARAMS = ("qweight", "qzeros", "scales")


class AWQConfig(QuantizationConfig):
    """`quantization_config = {"quant_method": "awq", "bits": 4, "group_size": G,
    "zero_point": true, "version": "gemm", "modules_to_not_convert": [...]}` (AutoAWQ's
    spellings `w_bit` and `q_group_size` are read too)."""

    name = "awq"
    tensor_parallel = True

    def __init__(self, group_size: int, modules_to_not_convert: tuple[str, ...] = ()) -> None:
        self.group_size = group_size
        self.modules_to_not_convert = modules_to_not_convert

    @classmethod
    def from_config(cls, hf_quant_config: dict[str, Any]) -> AWQConfig:
        bits = _field(hf_quant_config, "bits", "w_bit")
        if bits != awq_format.BITS:
            raise ValueError(f"bits: AWQ is read as 4-bit weights only, got {bits}")
        group_size = _field(hf_quant_config, "group_size", "q_group_size")
        if not isinstance(group_size, int) or group_size <= 0 or group_size % _RUN:
            raise ValueError(
                f"group_size: a positive multiple of {_RUN} (32, 64, 128...), got {group_size}"
            )
        if hf_quant_config.get("zero_point", True) is not True:
            raise ValueError("zero_point: only AWQ with zero points (true) is supported")
        version = str(hf_quant_config.get("version", "gemm")).lower()
        if version != "gemm":
            raise ValueError(f"version: only AutoAWQ's 'gemm' layout is supported, got {version!r}")
        skipped = hf_quant_config.get("modules_to_not_convert") or ()
        if not all(isinstance(name, str) for name in skipped):
            raise ValueError("modules_to_not_convert: a list of module names")
        return cls(group_size, tuple(skipped))

    def get_linear_method(self, layer_name: str) -> LinearMethod:
        if any(name in layer_name for name in self.modules_to_not_convert):
            return UnquantizedLinearMethod()
        return AWQLinearMethod(self.group_size)

    @classmethod
    def quantize_checkpoint(
        cls, checkpoint: Checkpoint, out_dir: Path, options: Mapping[str, Any]
    ) -> None:
        from core_quant_awq.quantize import quantize_checkpoint

        quantize_checkpoint(checkpoint, out_dir, options)


class AWQLinearMethod(LinearMethod):
    """Parameters `qweight`, `qzeros`, `scales` as AutoAWQ stores them (one fused output
    per shard along their last dimension); replaced after loading on the CPU."""

    def __init__(self, group_size: int) -> None:
        self.group_size = group_size

    def create_weights(
        self,
        layer: nn.Module,
        partition: LinearPartition,
        bias: bool,
        dtype: torch.dtype,
    ) -> None:
        name = getattr(layer, "prefix", "") or "layer"
        in_features = partition.input_size_per_partition
        sizes = partition.output_sizes_per_partition
        if in_features % self.group_size:
            raise ValueError(
                f"{name}: group_size {self.group_size} does not divide in_features {in_features}"
            )
        if any(size % awq_format.PACK for size in sizes):
            raise ValueError(
                f"{name}: AWQ packs {awq_format.PACK} outputs per int32; output sizes {sizes}"
            )
        groups = in_features // self.group_size
        packed_sizes = [size // awq_format.PACK for size in sizes]
        packed_loader = fused_weight_loader(packed_sizes, output_dim=1)
        qweight = add_parameter(
            layer, "qweight", (in_features, sum(packed_sizes)), torch.int32, packed_loader
        )
        # How each tensor lies along W, so tensor-parallel layers load their rank's slice.
        set_shard_dims(qweight, 1, 0, output_unit=awq_format.PACK)
        qzeros = add_parameter(
            layer, "qzeros", (groups, sum(packed_sizes)), torch.int32, packed_loader
        )
        set_shard_dims(qzeros, 1, 0, output_unit=awq_format.PACK, input_unit=self.group_size)
        scale_loader = fused_weight_loader(sizes, output_dim=1)
        scales = add_parameter(layer, "scales", (groups, sum(sizes)), torch.float16, scale_loader)
        set_shard_dims(scales, 1, 0, input_unit=self.group_size)
        if bias:
            loader = fused_weight_loader(sizes)
            set_shard_dims(add_parameter(layer, "bias", (sum(sizes),), dtype, loader), 0, None)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        if layer.qweight.device.type == "cuda":
            return  # the Triton kernel reads AutoAWQ's layout as it is
        q = awq_format.unpack_columns(layer.qweight).T  # [out, in]
        zeros = awq_format.unpack_columns(layer.qzeros).T.float()  # [out, groups]
        scales = layer.scales.T.float()  # [out, groups]
        store(layer, PackedWeight.from_zero_points(q, zeros, scales, 4))
        drop_parameters(layer, _CHECKPOINT_PARAMS)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        packed = stored(layer)
        if packed is not None:
            out = packed.matmul(x)
        else:
            from core_quant_awq.triton_awq import awq_gemm  # needs triton: imported on CUDA only

            out = awq_gemm(x, layer.qweight, layer.qzeros, layer.scales, self.group_size)
        return out if bias is None else out + bias

    def packed_weight(self, layer: nn.Module) -> PackedWeight | None:
        return stored(layer)  # None on CUDA: the Triton kernel reads AutoAWQ's layout

    def dequantize(self, layer: nn.Module) -> torch.Tensor:
        packed = stored(layer)
        weight = (
            packed.dequantize()
            if packed is not None
            else awq_format.dequantize(layer.qweight, layer.qzeros, layer.scales)
        )
        return weight.to(layer.params_dtype)


def _field(config: Mapping[str, Any], name: str, alias: str) -> Any:
    if name in config:
        return config[name]
    if alias in config:
        return config[alias]
    raise ValueError(f"{name}: missing from the AWQ quantization_config")
