"""Choosing the sampler: `--sampler NAME`, else the platform's preferred sampler."""

from __future__ import annotations

from typing import Any

from core.platforms.interface import Platform
from core.plugins.components import build_component
from core.plugins.groups import SAMPLERS
from core.plugins.registry import PluginRegistry, get_registry
from core.sample.interface import Sampler


def select_sampler_class(
    platform: Platform, forced: str | None = None, registry: PluginRegistry | None = None
) -> tuple[str, type[Sampler]]:
    """(entry name, Sampler class); PluginLookupError saying why when it cannot be had."""
    registry = registry or get_registry()
    name = forced or platform.preferred_sampler
    return name, registry.require(SAMPLERS, name, Sampler)


def build_sampler(
    platform: Platform,
    forced: str | None = None,
    config: dict[str, Any] | None = None,
    registry: PluginRegistry | None = None,
) -> Any:
    """The selected sampler, constructed with its `--sampler-config` keyword arguments."""
    _, cls = select_sampler_class(platform, forced, registry)
    return build_component(cls, config or {}, "--sampler-config")
