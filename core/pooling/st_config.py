"""A checkpoint's sentence-transformers configuration: how it pools, whether it normalizes.

sentence-transformers saves a model as a Hugging Face directory plus `modules.json`, its
modules in order (a Transformer, then Pooling, then optionally Normalize), each module's
settings in its own folder (`1_Pooling/config.json`). core runs the Transformer itself
and reproduces Pooling (cls, mean, lasttoken) and Normalize. Any other module (a Dense
projection, max pooling, ...) would change the vector, so a checkpoint that has one is
refused with the reason rather than served with different embeddings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.pooling.interface import PoolingType

__all__ = ["SentenceTransformersConfig", "read_sentence_transformers_config"]

_MODULES_FILE = "modules.json"

# The pooling modes core reproduces, by sentence-transformers' names.
_POOLING_MODES = {"cls": PoolingType.CLS, "mean": PoolingType.MEAN, "lasttoken": PoolingType.LAST}
# How sentence-transformers before 6 wrote the modes: one switch per mode.
_LEGACY_MODE_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
_MODULE_KINDS = ("Transformer", "Pooling", "Normalize")


@dataclass(frozen=True)
class SentenceTransformersConfig:
    pooling_type: PoolingType
    normalize: bool  # a Normalize module follows the pooling


def read_sentence_transformers_config(model_dir: Path) -> SentenceTransformersConfig | None:
    """The pooling `model_dir`'s modules.json describes; None when it has none (then the
    checkpoint is not a sentence-transformers model). ValueError naming the file and the
    module when a module is one core does not reproduce, or a file is unreadable."""
    modules_path = model_dir / _MODULES_FILE
    if not modules_path.is_file():
        return None
    modules = _read_json(modules_path)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise ValueError(f"{modules_path} should hold a list of module objects")
    kinds = [_module_kind(modules_path, module) for module in modules]
    if "Pooling" not in kinds:
        raise ValueError(f"{modules_path} has no Pooling module: no sentence vector to serve")
    pooling = modules[kinds.index("Pooling")]
    pooling_path = model_dir / str(pooling.get("path", "")) / "config.json"
    return SentenceTransformersConfig(
        pooling_type=_pooling_type(pooling_path, _read_json(pooling_path)),
        normalize="Normalize" in kinds[kinds.index("Pooling") :],
    )


def _module_kind(modules_path: Path, module: dict[str, Any]) -> str:
    """The module's class name ("Pooling" for "sentence_transformers.models.Pooling")."""
    kind = str(module.get("type", "")).rsplit(".", 1)[-1]
    if kind not in _MODULE_KINDS:
        raise ValueError(
            f"{modules_path}: module {module.get('type')!r} is not supported (core reproduces "
            f"{', '.join(_MODULE_KINDS)}); its embeddings would differ"
        )
    return kind


def _pooling_type(path: Path, config: Any) -> PoolingType:
    if not isinstance(config, dict):
        raise ValueError(f"{path} should hold a JSON object")
    if not config.get("include_prompt", True):
        raise ValueError(f"{path}: include_prompt false is not supported")
    modes = _pooling_modes(config)
    if len(modes) != 1:
        # Several modes make one vector of their results side by side.
        raise ValueError(f"{path}: pooling modes {modes or 'none'}; core pools with exactly one")
    if modes[0] not in _POOLING_MODES:
        raise ValueError(
            f"{path}: pooling mode {modes[0]!r} is not supported (only {', '.join(_POOLING_MODES)})"
        )
    return _POOLING_MODES[modes[0]]


def _pooling_modes(config: dict[str, Any]) -> list[str]:
    """The modes a Pooling config turns on: `pooling_mode`, one name or a list of them
    (sentence-transformers >= 6), else the older `pooling_mode_*` switches."""
    if "pooling_mode" in config:
        mode = config["pooling_mode"]
        return [mode] if isinstance(mode, str) else [str(m) for m in mode]
    return [name for key, name in _LEGACY_MODE_KEYS.items() if config.get(key)]


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is not readable JSON: {exc}") from exc
