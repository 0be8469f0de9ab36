"""Finding a quantization method by name in the `core.quantization` entry-point group."""

from __future__ import annotations

from core.plugins.groups import QUANTIZATION
from core.plugins.registry import PluginRegistry, get_registry
from core.quantization.interface import QuantizationConfig


def get_quantization_config_class(
    name: str, registry: PluginRegistry | None = None
) -> type[QuantizationConfig]:
    """The QuantizationConfig class registered as `name`.

    Raises PluginLookupError (a ValueError) listing the installed methods when `name` is
    not one of them, or giving the reason when its plugin cannot be loaded or registers
    something other than a QuantizationConfig subclass.
    """
    registry = registry or get_registry()
    return registry.require(QUANTIZATION, name, QuantizationConfig)
