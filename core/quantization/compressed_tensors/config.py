"""compressed-tensors checkpoints (LLM Compressor's format) as a core method, entry
`compressed-tensors`.

`quantization_config = {"quant_method": "compressed-tensors", "format": ..., "config_groups":
{NAME: {"targets": [...], "weights": {...}, "input_activations": {...} | null}, ...},
"ignore": [...]}`. Each linear layer takes the scheme (`scheme.parse_scheme`) of the config
group whose targets name it, unless `ignore` does: a target is a module name, a "re:"
pattern matched from the start of the name, or the class "Linear" (every linear layer);
a name beats a pattern, a pattern beats the class. Layers nothing targets, and ignored
ones, stay unquantized. The checkpoint names the projections core fuses (q_proj, k_proj,
v_proj into qkv_proj; gate_proj, up_proj into gate_up_proj): a fused layer takes its
projections' scheme, which must be one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from core.quantization.compressed_tensors.pack_quantized import PackQuantizedLinearMethod
from core.quantization.compressed_tensors.scheme import Scheme, parse_scheme
from core.quantization.compressed_tensors.w8a8 import W8A8LinearMethod
from core.quantization.interface import FUSED_CHECKPOINT_MODULES, LinearMethod, QuantizationConfig
from core.quantization.unquantized import UnquantizedLinearMethod

_LINEAR_CLASS = "Linear"
_LM_HEAD = "lm_head"
_PATTERN_PREFIX = "re:"
# Top-level settings that would change what the tensors mean: refused when present.
_REFUSED_SETTINGS = {
    "kv_cache_scheme": "quantized KV caches (k_scale / v_scale) are not read",
    "transform_config": "transformed weights (rotations) are not supported",
}


@dataclass(frozen=True)
class _Target:
    """One entry of a `targets` or `ignore` list (see the module docstring)."""

    text: str
    pattern: re.Pattern[str] | None  # for "re:" entries

    def rank(self, name: str, linear: bool) -> int | None:
        """How closely this entry names module `name` (a linear layer when `linear`): 0
        by name, 1 by pattern, 2 by class; None when it does not."""
        if self.pattern is not None:
            return 1 if self.pattern.match(name) else None
        if self.text == name:
            return 0
        return 2 if linear and self.text == _LINEAR_CLASS else None


@dataclass(frozen=True)
class _Group:
    """A config group: its field path ("config_groups.NAME"), targets and scheme."""

    path: str
    targets: tuple[_Target, ...]
    scheme: Scheme


class CompressedTensorsConfig(QuantizationConfig):
    """compressed-tensors' W4A16 / W8A16 ("pack-quantized") and W8A8 int8 ("int-quantized")
    schemes; see the module docstring."""

    name = "compressed-tensors"
    tensor_parallel = True

    def __init__(self, groups: tuple[_Group, ...], ignore: tuple[_Target, ...]) -> None:
        self.groups = groups
        self.ignore = ignore

    @classmethod
    def from_config(cls, hf_quant_config: dict[str, Any]) -> CompressedTensorsConfig:
        for key, reason in _REFUSED_SETTINGS.items():
            if hf_quant_config.get(key) is not None:
                raise ValueError(f"{key}: {reason}")
        _check_dense(hf_quant_config.get("sparsity_config"))
        groups = hf_quant_config.get("config_groups")
        if not isinstance(groups, Mapping) or not groups:
            raise ValueError(f"config_groups: a non-empty JSON object of groups, got {groups!r}")
        default_format = hf_quant_config.get("format")
        parsed = tuple(_group(name, group, default_format) for name, group in groups.items())
        config = cls(parsed, _targets(hf_quant_config.get("ignore") or [], "ignore"))
        # Checkpoints name the LM head "lm_head", a Linear module: core keeps it unquantized.
        head_group = config._match(_LM_HEAD, linear=True)
        if head_group is not None:
            raise ValueError(
                f"ignore: {_LM_HEAD} is quantized ({head_group.path} targets it), but core "
                "reads the LM head unquantized only"
            )
        return config

    def get_linear_method(self, layer_name: str) -> LinearMethod:
        group = self._layer_group(layer_name)
        if group is None:
            return UnquantizedLinearMethod()
        if group.scheme.int8_activations:
            return W8A8LinearMethod()
        return PackQuantizedLinearMethod(group.scheme, f"{group.path}.weights")

    def _layer_group(self, layer_name: str) -> _Group | None:
        """The group of linear layer `layer_name` (its projections' one group, if fused),
        None when it stays unquantized; ValueError when its projections differ."""
        names = _checkpoint_names(layer_name)
        groups = [self._match(name, linear=True) for name in names]
        schemes = {None if group is None else group.scheme for group in groups}
        if len(schemes) > 1:
            found = ", ".join(
                f"{name}: {'unquantized' if group is None else group.scheme.name}"
                for name, group in zip(names, groups, strict=True)
            )
            raise ValueError(
                f"{layer_name}: core fuses these projections into one layer, so they must "
                f"share one scheme ({found})"
            )
        return groups[0]

    def _match(self, name: str, linear: bool) -> _Group | None:
        """The group whose targets name module `name` most closely, unless ignored."""
        if any(target.rank(name, linear) is not None for target in self.ignore):
            return None
        best: tuple[int, _Group] | None = None
        for group in self.groups:
            for target in group.targets:
                rank = target.rank(name, linear)
                if rank is not None and (best is None or rank < best[0]):
                    best = (rank, group)
        return None if best is None else best[1]


def _group(name: str, group: Any, default_format: Any) -> _Group:
    path = f"config_groups.{name}"
    scheme = parse_scheme(path, group, default_format)  # first: it checks group is an object
    return _Group(path, _targets(group.get("targets"), f"{path}.targets"), scheme)


def _checkpoint_names(layer_name: str) -> tuple[str, ...]:
    """The checkpoint modules core's layer `layer_name` holds (its projections, if fused)."""
    parent, _, leaf = layer_name.rpartition(".")
    shards = FUSED_CHECKPOINT_MODULES.get(leaf)
    if shards is None:
        return (layer_name,)
    return tuple(f"{parent}.{shard}" if parent else shard for shard in shards)


def _targets(entries: Any, path: str) -> tuple[_Target, ...]:
    if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
        raise ValueError(f"{path}: a list of module names, 're:' patterns or 'Linear'")
    return tuple(_target(entry, path) for entry in entries)


def _target(entry: str, path: str) -> _Target:
    if not entry.startswith(_PATTERN_PREFIX):
        return _Target(entry, None)
    try:
        return _Target(entry, re.compile(entry.removeprefix(_PATTERN_PREFIX)))
    except re.error as exc:
        raise ValueError(f"{path}: {entry!r} is not a regular expression ({exc})") from exc


def _check_dense(sparsity: Any) -> None:
    """Sparse formats (2:4, bitmasks) store weights core cannot read: refused."""
    if not sparsity:
        return
    stored = sparsity.get("format") if isinstance(sparsity, Mapping) else sparsity
    if stored not in (None, "dense"):
        raise ValueError(f"sparsity_config.format: sparse weights ({stored!r}) are not supported")
