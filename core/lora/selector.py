"""Finding the `core.lora` implementation that serves `--enable-lora`."""

from __future__ import annotations

from core.config import LoRAConfig
from core.lora.interface import LoRAManager
from core.plugins.groups import LORA
from core.plugins.registry import PluginLookupError, PluginRegistry, get_registry

__all__ = ["lora_manager_class"]

PROVIDER = "core-lora"
"""The distribution that provides core's LoRA implementation ("default")."""


def lora_manager_class(
    config: LoRAConfig, registry: PluginRegistry | None = None
) -> type[LoRAManager]:
    """The LoRAManager class of `config.implementation`; ValueError naming --enable-lora
    and, when core's implementation is not installed, the package that provides it."""
    registry = registry or get_registry()
    try:
        return registry.require(LORA, config.implementation, LoRAManager)
    except PluginLookupError as exc:
        hint = ""
        if exc.reason == "not installed" and config.implementation == "default":
            hint = f" (pip install {PROVIDER})"
        raise ValueError(f"--enable-lora: {exc}{hint}") from exc
