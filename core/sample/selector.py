"""Choosing the sampler: `--sampler NAME`, else the platform's preferred sampler."""

from __future__ import annotations

from typing import Any

from core.platforms.interface import Platform
from core.plugins.components import build_component
from core.plugins.groups import SAMPLERS
from core.plugins.registry import PluginRegistry, get_registry


def select_sampler_class(
    platform: Platform, forced: str | None = None, registry: PluginRegistry | None = None
) -> tuple[str, type]:
    """(entry name, Sampler class); ValueError saying why when it cannot be had."""
    registry = registry or get_registry()
    name = forced or platform.preferred_sampler
    entry = registry.get(SAMPLERS, name)
    if entry is None:
        installed = sorted(e.name for e in registry.entries(SAMPLERS))
        raise ValueError(f"sampler {name!r} is not installed; installed: {installed}")
    cls = registry.load(entry)
    if cls is None:
        raise ValueError(f"sampler {name!r} cannot be used: {entry.state.value}: {entry.reason}")
    return name, cls


def build_sampler(
    platform: Platform,
    forced: str | None = None,
    config: dict[str, Any] | None = None,
    registry: PluginRegistry | None = None,
) -> Any:
    """The selected sampler, constructed with its `--sampler-config` keyword arguments."""
    _, cls = select_sampler_class(platform, forced, registry)
    return build_component(cls, config or {}, "--sampler-config")
