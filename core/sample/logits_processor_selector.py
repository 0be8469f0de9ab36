"""Which custom logits processors an engine runs: every `core.logits_processors` plugin, then
the classes `--logits-processors` (LLM's `logits_processors=`) names.

A plugin is loaded as other plugin groups are: one that fails to import, or whose value is
not a LogitsProcessor class, is logged, shown failed by `core plugins`, and skipped. A
class named by the flag was asked for, so one that cannot be had is a ValueError naming
the flag. Both the frontend (for `validate_params`, and to fail before the engine core
starts) and each worker (to build them) select them, with the same result.

Refused, rather than left unused:
- `--logits-processors` with `--runner pooling`: a pooling model samples nothing (an
  installed plugin simply does not apply to it);
- any processor with `--speculative-config`: drafts are verified against logits that no
  custom processor has seen. Leave an installed plugin out with CORE_PLUGINS.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from core.config import EngineConfig
from core.plugins.groups import LOGITS_PROCESSORS
from core.plugins.registry import PluginEntry, PluginRegistry, get_registry, shape_error
from core.sample.logits_processor import LogitsProcessor
from core.sample.logits_processors import LogitsProcessors

__all__ = ["build_logits_processors", "logits_processor_classes"]

_FLAG = "--logits-processors"


def logits_processor_classes(
    config: EngineConfig, registry: PluginRegistry | None = None
) -> list[type[LogitsProcessor]]:
    """The processor classes of an engine of `config`, plugins first (by entry name);
    ValueError naming the flags when they cannot run together."""
    named = [_import_class(name) for name in config.components.logits_processors]
    if config.pooler is not None:
        if named:
            raise ValueError(f"{_FLAG}: a pooling model (--runner pooling) samples nothing")
        return []
    classes = _plugin_classes(registry or get_registry())
    classes += [cls for cls in named if cls not in classes]
    if classes and config.speculative is not None:
        names = ", ".join(cls.__qualname__ for cls in classes)
        raise ValueError(
            f"--speculative-config: custom logits processors ({names}) cannot run with "
            f"speculative decoding; drop {_FLAG}, or leave a plugin out with CORE_PLUGINS"
        )
    return classes


def build_logits_processors(
    config: EngineConfig, device: torch.device, is_pin_memory: bool
) -> LogitsProcessors:
    """One instance of each selected class, for one worker."""
    processors = []
    for cls in logits_processor_classes(config):
        try:
            processors.append(cls(config, device, is_pin_memory))
        except Exception as exc:
            raise ValueError(
                f"logits processor {cls.__qualname__} failed to start: {type(exc).__name__}: {exc}"
            ) from exc
    return LogitsProcessors(processors)


def _plugin_classes(registry: PluginRegistry) -> list[type[LogitsProcessor]]:
    found: dict[str, type[LogitsProcessor]] = {}

    def use(entry: PluginEntry, value: Any) -> None:
        wrong = shape_error(value, LogitsProcessor)
        if wrong is not None:
            raise TypeError(wrong)
        found[entry.name] = value

    registry.use_each(LOGITS_PROCESSORS, use, "taking the class")
    return [found[name] for name in sorted(found)]


def _import_class(name: str) -> type[LogitsProcessor]:
    """The class `module.path:Class` (or vLLM's `module.path.Class`) names."""
    module_name, sep, attributes = name.partition(":")
    if not sep:
        module_name, _, attributes = name.rpartition(".")
    try:
        value: Any = importlib.import_module(module_name)
        for attribute in attributes.split("."):
            value = getattr(value, attribute)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"{_FLAG} {name}: cannot be imported: {exc}") from exc
    wrong = shape_error(value, LogitsProcessor)
    if wrong is not None:
        raise ValueError(f"{_FLAG} {name}: {wrong}")
    return value
