"""Finding a quantization method by name in the `core.quantization` entry-point group."""

from __future__ import annotations

from core.plugins.groups import QUANTIZATION
from core.plugins.registry import PluginRegistry, get_registry
from core.quantization.interface import QuantizationConfig


def get_quantization_config_class(
    name: str, registry: PluginRegistry | None = None
) -> type[QuantizationConfig]:
    """The QuantizationConfig class registered as `name`.

    Raises ValueError listing the installed methods when `name` is not one of them, or
    giving the reason when its plugin cannot be loaded.
    """
    registry = registry or get_registry()
    entry = registry.get(QUANTIZATION, name)
    if entry is None:
        installed = sorted(e.name for e in registry.entries(QUANTIZATION))
        raise ValueError(f"quantization method {name!r} is not installed; installed: {installed}")
    cls = registry.load(entry)
    if cls is None:
        raise ValueError(
            f"quantization method {name!r} cannot be used: {entry.state.value}: {entry.reason}"
        )
    if not (isinstance(cls, type) and issubclass(cls, QuantizationConfig)):
        registry.mark_failed(entry, "entry point is not a QuantizationConfig subclass")
        raise ValueError(f"quantization method {name!r} is not a QuantizationConfig subclass")
    return cls
