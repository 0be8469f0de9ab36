"""Quantization: the QuantizationConfig / LinearMethod interfaces, their reference, lookup."""

from core.quantization.interface import (
    LinearMethod,
    LinearPartition,
    LinearSplit,
    QuantizationConfig,
    WrappedLinearMethod,
)
from core.quantization.registry import get_quantization_config_class
from core.quantization.unquantized import UnquantizedLinearMethod
from core.quantization.weight_loader import (
    WeightLoader,
    add_parameter,
    default_weight_loader,
    fused_weight_loader,
    get_weight_loader,
    set_shard_dims,
    set_weight_loader,
)

__all__ = [
    "LinearMethod",
    "LinearPartition",
    "LinearSplit",
    "QuantizationConfig",
    "UnquantizedLinearMethod",
    "WeightLoader",
    "WrappedLinearMethod",
    "add_parameter",
    "default_weight_loader",
    "fused_weight_loader",
    "get_quantization_config_class",
    "get_weight_loader",
    "set_shard_dims",
    "set_weight_loader",
]
