"""Choosing the IO processor of a model (entry-point group `core.io_processors`).

The name comes from `--io-processor-plugin NAME`, else from the checkpoint's config.json
field `io_processor_plugin` (a model made for one processor names it there); with neither
the model has none. As every group's lookup, the name goes through `PluginRegistry.require`
(CORE_PLUGINS filtering, the API version check, a failing entry marked and reported), and
only the named entry is imported: another processor that is broken never gets in the way.
The frontend calls this once, at start-up; the engine core never does, so a processor and
its dependencies are imported in the frontend process only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from core.config import EngineConfig, ModelConfig
from core.io_processors.interface import IOProcessor
from core.plugins.groups import IO_PROCESSORS
from core.plugins.registry import PluginLookupError, PluginRegistry, get_registry

__all__ = [
    "FLAG",
    "HF_CONFIG_FIELD",
    "io_processor_class",
    "load_io_processor",
    "require_io_processor",
]

FLAG = "--io-processor-plugin"
HF_CONFIG_FIELD = "io_processor_plugin"
"""The config.json field through which a checkpoint names its IO processor."""


def io_processor_class(
    model: ModelConfig, hf_config: Mapping[str, Any], registry: PluginRegistry | None = None
) -> type[IOProcessor] | None:
    """The IOProcessor class `model` asks for (`--io-processor-plugin`, else `hf_config`'s
    `io_processor_plugin`); None when neither names one. ValueError naming where the name
    came from and why it cannot be had: no IO processor installed at all, or this one not
    installed (with the names that are), filtered, refused or failed."""
    requested = _requested_name(model, hf_config)
    if requested is None:
        return None
    name, source = requested
    registry = registry or get_registry()
    if not registry.entries(IO_PROCESSORS):
        raise ValueError(
            f"{source} {name!r}: an IO processor plugin is needed but none is installed "
            f"(entry-point group {IO_PROCESSORS})"
        )
    try:
        return registry.require(IO_PROCESSORS, name, IOProcessor)
    except PluginLookupError as exc:
        raise ValueError(f"{source}: {exc}") from exc


def load_io_processor(
    config: EngineConfig, hf_config: Mapping[str, Any], registry: PluginRegistry | None = None
) -> IOProcessor | None:
    """The IO processor of this engine, built as `cls(config)`; None when the model has
    none. ValueError as `io_processor_class` says, or from the processor's constructor."""
    cls = io_processor_class(config.model, hf_config, registry)
    return None if cls is None else cls(config)


def _requested_name(model: ModelConfig, hf_config: Mapping[str, Any]) -> tuple[str, str] | None:
    """(name, where it was given) — the flag wins over config.json — or None."""
    if model.io_processor_plugin is not None:
        return model.io_processor_plugin, FLAG
    name = hf_config.get(HF_CONFIG_FIELD)
    if name is None:
        return None
    source = f"config.json's {HF_CONFIG_FIELD}"
    if not isinstance(name, str) or not name:
        raise ValueError(f"{source} must name an IO processor, got {name!r}")
    return name, source


def require_io_processor(processor: IOProcessor | None) -> IOProcessor:
    """`processor`; when the engine has none, ValueError saying how to give it one."""
    if processor is None:
        raise ValueError(
            f"no IO processor is configured: start the engine with {FLAG} NAME (entry-point "
            f"group {IO_PROCESSORS}), or name one in the checkpoint's config.json "
            f"{HF_CONFIG_FIELD}"
        )
    return processor
