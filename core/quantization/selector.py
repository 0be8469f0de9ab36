"""Which quantization method a model runs with, and building its QuantizationConfig.

The checkpoint decides what is possible: weights stored by a method (a
`quantization_config.quant_method` in config.json, e.g. AWQ) run with that method only;
a GGUF file runs dequantized to `--dtype` or, with `--quantization gguf`, kept in its
blocks; float weights run unquantized, or quantized as they load by a method that can
(`--quantization fp8`, `QuantizationConfig.for_float_weights`). `--quantization` chooses
among those, and `none` asks for dequantized weights where the format allows it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.config import QUANTIZATION_NONE
from core.plugins.registry import PluginLookupError, PluginRegistry
from core.quantization.interface import QuantizationConfig
from core.quantization.registry import get_quantization_config_class

PROVIDERS = {"awq": "core-quant-awq"}
"""The distributions that provide methods core knows of but does not ship."""


@dataclass(frozen=True)
class StoredQuantization:
    """How a checkpoint stores its weights, as far as choosing a method goes.

    `method`: the quantization method its tensors are in (None: float weights);
    `dequantizable`: whether core can also load them as floats (GGUF's blocks).
    """

    method: str | None = None
    dequantizable: bool = False


def resolve_quantization(
    requested: str | None, stored: StoredQuantization, keep_blocks: bool = False
) -> str | None:
    """The method the model runs with (None: float weights), from `--quantization`
    (None: automatic) and how the checkpoint is stored; ValueError naming the flag when
    the two do not fit together. `keep_blocks`: left to itself, run a format that could
    be dequantized (GGUF) in its blocks (see `keeps_blocks`)."""
    if requested is None:
        return None if stored.dequantizable and not keep_blocks else stored.method
    if requested == QUANTIZATION_NONE:
        if stored.method is not None and not stored.dequantizable:
            raise ValueError(
                f"--quantization none: the checkpoint's weights are {stored.method}-"
                "quantized and cannot be loaded as floats"
            )
        return None
    if requested != stored.method:
        if stored.method is None and _quantizes_float_weights(requested):
            return requested
        have = f"{stored.method}-quantized" if stored.method else "not quantized (float weights)"
        hint = "" if stored.method else f"; make a checkpoint with `core quantize {requested}`"
        raise ValueError(f"--quantization {requested}: the checkpoint is {have}{hint}")
    return requested


def _quantizes_float_weights(name: str) -> bool:
    """Whether method `name` quantizes float weights as they load (`--quantization fp8` on
    a float checkpoint: QuantizationConfig.for_float_weights)."""
    return quantization_config_class(name).for_float_weights() is not None


def quantization_config_class(
    name: str, registry: PluginRegistry | None = None, asked_by: str = "--quantization"
) -> type[QuantizationConfig]:
    """The QuantizationConfig class of method `name`; ValueError naming what asked for it
    (`asked_by`: the flag, or a command) and, when the method is not installed, the
    package that provides it."""
    try:
        return get_quantization_config_class(name, registry)
    except PluginLookupError as exc:
        provider = PROVIDERS.get(name)
        hint = f" (pip install {provider})" if provider and exc.reason == "not installed" else ""
        raise ValueError(f"{asked_by} {name}: {exc}{hint}") from exc


def build_quantization_config(
    name: str, hf_config: dict[str, Any], registry: PluginRegistry | None = None
) -> QuantizationConfig:
    """The method's config from the checkpoint's `quantization_config`; when it has none,
    the method's config for float weights if it quantizes them as they load, else one
    from just its name (a GGUF file); ValueError naming the field."""
    cls = quantization_config_class(name, registry)
    settings = hf_config.get("quantization_config")
    online = None if settings else cls.for_float_weights()
    if online is not None:
        return online
    settings = settings or {"quant_method": name}
    try:
        return cls.from_config(dict(settings))
    except ValueError as exc:
        raise ValueError(f"quantization_config ({name}): {exc}") from exc


def keeps_blocks(device_type: str) -> bool:
    """Whether a GGUF file runs in its blocks (packed 4/8-bit) unless told otherwise.

    Yes where a kernel (not the reference, which dequantizes on every call) serves
    core::quant_linear on `device_type`. That kernel decides per weight shape and row
    count: core-cpu-kernels times the packed weight's GEMV and GEMMs against a dequantized
    copy at start (core.kernel_choice), so few rows read the small packed weight (a
    single stream's decode, 1.6-2.5x faster than dequantized weights on the EPYCs and
    Xeons measured) and many rows run where they measure fastest, on AMX a dequantized
    bf16 copy through oneDNN (4.6x faster prefills than bf16 strips there). Kept blocks
    can do all a dequantized model does, at the cost of the copies' memory only.
    """
    from core.ops import provider

    return provider("quant_linear", device_type) is not None
