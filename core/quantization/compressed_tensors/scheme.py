"""One compressed-tensors config group read as a scheme core runs, or refused naming its field.

A config group is `{"targets": [...], "weights": ARGS, "input_activations": ARGS | null,
"output_activations": null, "format": ...}` (LLM Compressor's QuantizationScheme), ARGS
being `{"num_bits", "type", "symmetric", "strategy", "group_size", "dynamic", "actorder",
...}`. Core runs:
- W4A16 / W8A16: int weights of 4 or 8 bits per group or per channel (one group of all
  of a row's inputs), symmetric or with zero points, stored "pack-quantized"; the
  activations stay in the model's dtype;
- W8A8: int8 weights per channel, symmetric, stored "int-quantized", with activations
  quantized to int8 per token as the layer runs (dynamic, symmetric).
Everything else (float types: FP8 and FP4 schemes; per-tensor, block or token weight
strategies; static activation scales; activation reordering with `weight_g_idx`; other
bit widths and formats) raises ValueError naming the field that asks for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

PACKED_FORMAT = "pack-quantized"
INT_FORMAT = "int-quantized"
WEIGHT_BITS = (4, 8)
# core.ops.quant_linear's packed layout: a 4-bit group holds whole runs of 32 inputs, an
# 8-bit group a multiple of 16.
GROUP_UNIT = {4: 32, 8: 16}
# Reordering that leaves no `weight_g_idx` in the checkpoint (it only chose the order in
# which the quantizer visited the columns).
_ORDER_FREE_ACTORDER = (None, False, "weight", "static")
# What LLM Compressor assumes for a setting a config leaves out.
_DEFAULTS = {"type": "int", "symmetric": True, "dynamic": False}


@dataclass(frozen=True)
class Scheme:
    """How one linear layer's checkpoint tensors are quantized."""

    num_bits: int
    group_size: int | None  # None: per channel, one group of a row's inputs
    symmetric: bool
    int8_activations: bool  # W8A8: activations quantized per token as the layer runs

    @property
    def name(self) -> str:
        return f"W{self.num_bits}A{8 if self.int8_activations else 16}"

    @property
    def format(self) -> str:
        """The checkpoint format core reads this scheme from."""
        return INT_FORMAT if self.int8_activations else PACKED_FORMAT


def parse_scheme(path: str, group: Any, default_format: Any) -> Scheme:
    """The scheme of config group `group` (`path`: "config_groups.NAME"), stored in
    `default_format` (the top-level "format") unless the group names its own."""
    _check_object(group, path)
    if group.get("output_activations") is not None:
        raise ValueError(f"{path}.output_activations: quantized outputs are not supported")
    weights = group.get("weights")
    _check_object(weights, f"{path}.weights")
    scheme = _weight_scheme(weights, f"{path}.weights")
    activations = group.get("input_activations")
    if activations is not None:
        _check_object(activations, f"{path}.input_activations")
        _check_w8a8(weights, activations, path)
        scheme = replace(scheme, int8_activations=True)
    format_field = f"{path}.format" if group.get("format") is not None else "format"
    stored = group.get("format") or default_format
    if stored != scheme.format:
        raise ValueError(
            f"{format_field}: {scheme.name} is read from {scheme.format!r} checkpoints, "
            f"got {stored!r}"
        )
    return scheme


def _weight_scheme(args: Mapping[str, Any], path: str) -> Scheme:
    if _setting(args, "type") != "int":
        raise ValueError(
            f"{path}.type: {args['type']!r} weights (an FP8 or FP4 scheme) are not supported; "
            "core reads int W4A16, W8A16 and W8A8"
        )
    bits = args.get("num_bits")
    if not isinstance(bits, int) or bits not in WEIGHT_BITS:
        raise ValueError(
            f"{path}.num_bits: {bits!r}-bit weights are not supported; core reads int W4A16, "
            "W8A16 and W8A8"
        )
    if _setting(args, "dynamic") is not False:
        raise ValueError(f"{path}.dynamic: weights must be quantized ahead of time (false)")
    if args.get("actorder") not in _ORDER_FREE_ACTORDER:
        raise ValueError(
            f"{path}.actorder: {args['actorder']!r} (activation reordering, weight_g_idx) "
            "is not supported"
        )
    symmetric = _setting(args, "symmetric")
    if not isinstance(symmetric, bool):
        raise ValueError(f"{path}.symmetric: true or false, got {symmetric!r}")
    return Scheme(bits, _group_size(args, path, bits), symmetric, False)


def _group_size(args: Mapping[str, Any], path: str, bits: int) -> int | None:
    strategy, group_size = args.get("strategy"), args.get("group_size")
    if strategy == "channel":
        if group_size not in (None, -1):
            raise ValueError(f"{path}.group_size: per channel there is none, got {group_size!r}")
        return None
    if strategy != "group":
        raise ValueError(f"{path}.strategy: {strategy!r} is not supported (group or channel)")
    unit = GROUP_UNIT[bits]
    if not isinstance(group_size, int) or group_size <= 0 or group_size % unit:
        raise ValueError(
            f"{path}.group_size: a positive multiple of {unit} for {bits}-bit groups, "
            f"got {group_size!r}"
        )
    return group_size


# W8A8 as core runs it: the one combination of weight and activation settings.
_W8A8_WEIGHTS = {"num_bits": 8, "strategy": "channel", "symmetric": True}
_W8A8_ACTIVATIONS = {
    "type": "int",
    "num_bits": 8,
    "strategy": "token",
    "dynamic": True,
    "symmetric": True,
}


def _check_w8a8(weights: Mapping[str, Any], activations: Mapping[str, Any], path: str) -> None:
    """Quantized activations: only dynamic symmetric int8 per token, over symmetric int8
    weights per channel."""
    for key, want in _W8A8_ACTIVATIONS.items():
        got = _setting(activations, key)
        if got != want:
            raise ValueError(
                f"{path}.input_activations.{key}: activations are read as dynamic symmetric "
                f"int8 per token ({key} {want!r}), got {got!r}"
            )
    for key, want in _W8A8_WEIGHTS.items():
        got = _setting(weights, key)
        if got != want:
            raise ValueError(
                f"{path}.weights.{key}: with int8 activations the weights are read as "
                f"symmetric int8 per channel ({key} {want!r}), got {got!r}"
            )


def _setting(args: Mapping[str, Any], key: str) -> Any:
    return args.get(key, _DEFAULTS.get(key))


def _check_object(value: Any, path: str) -> None:
    if not isinstance(value, Mapping):
        raise ValueError(f"{path}: a JSON object, got {value!r}")
