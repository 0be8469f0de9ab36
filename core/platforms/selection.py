"""Choosing the platform of this process from the `core.platforms` entry points.

Exactly one available non-CPU platform wins; the CPU when none is; two or more is an
error naming them unless `--device NAME` or CORE_PLATFORM=NAME chooses. The choice and
every rejection are logged with their reasons.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass, field

from core import envs
from core.platforms.interface import Platform, Unavailable
from core.plugins.groups import PLATFORMS
from core.plugins.registry import (
    EntryState,
    PluginLookupError,
    PluginRegistry,
    get_registry,
    shape_error,
)

logger = logging.getLogger(__name__)

CPU = "cpu"


@dataclass
class PlatformChoice:
    """The chosen platform, why it was chosen, and why every other one was not."""

    name: str
    platform: Platform
    reason: str
    rejected: dict[str, str] = field(default_factory=dict)


def select_platform(
    registry: PluginRegistry | None = None, requested: str | None = None
) -> PlatformChoice:
    """Probe every admitted platform entry and choose one (see module docstring)."""
    registry = registry or get_registry()
    requested = requested or envs.platform_name()
    if requested is not None:
        registry.require(PLATFORMS, requested)  # not installed or not loadable: says why
    available, rejected = _probe_all(registry)
    name, reason = _choose(available, rejected, requested)
    for other, why in rejected.items():
        logger.info("platform %s rejected: %s", other, why)
    platform = _instantiate(registry, name, available[name])
    logger.info("platform %s selected: %s", name, reason)
    return PlatformChoice(name, platform, reason, rejected)


def _probe_all(registry: PluginRegistry) -> tuple[dict[str, str], dict[str, str]]:
    """({name: class path} of available platforms, {name: reason} of the others)."""
    available: dict[str, str] = {}
    rejected: dict[str, str] = {}
    for entry in registry.entries(PLATFORMS):
        try:
            probe = registry.require(PLATFORMS, entry.name)
        except PluginLookupError as exc:
            rejected[entry.name] = exc.reason
            continue
        try:
            path = probe()
        except Unavailable as exc:
            rejected[entry.name] = f"unavailable: {exc.reason}"
            continue
        except Exception as exc:  # a broken probe must not stop platform selection
            registry.mark_failed(entry, f"probe raised {type(exc).__name__}: {exc}")
            rejected[entry.name] = f"failed: {entry.reason}"
            continue
        if path is None:
            rejected[entry.name] = "unavailable: probe found no device"
        else:
            available[entry.name] = path
    return available, rejected


def _choose(
    available: dict[str, str], rejected: dict[str, str], requested: str | None
) -> tuple[str, str]:
    if requested is not None:
        if requested in available:
            return requested, f"requested by --device / CORE_PLATFORM={requested}"
        why = rejected[requested]  # select_platform checked that it is installed
        raise ValueError(f"platform {requested!r} was requested but cannot be used: {why}")
    accelerators = sorted(name for name in available if name != CPU)
    if len(accelerators) > 1:
        raise ValueError(
            f"several platforms are available: {', '.join(accelerators)}; choose one with "
            "--device NAME or CORE_PLATFORM=NAME"
        )
    if accelerators:
        return accelerators[0], "the only available accelerator platform"
    if CPU not in available:
        raise ValueError(f"no platform is available: {rejected}")
    return CPU, "no accelerator platform is available"


def _instantiate(registry: PluginRegistry, name: str, path: str) -> Platform:
    module_name, _, class_name = path.rpartition(".")
    entry = registry.get(PLATFORMS, name)
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        if entry is not None and entry.state is EntryState.LOADED:
            registry.mark_failed(entry, f"platform class {path} cannot be imported: {exc}")
        raise ValueError(f"platform {name}: cannot import {path}: {exc}") from exc
    wrong = shape_error(cls, Platform)
    if wrong is not None:
        raise ValueError(f"platform {name}: {path}: {wrong}")
    return cls()


_current: PlatformChoice | None = None


def current_platform_choice() -> PlatformChoice:
    """The platform of this process, selected on first use."""
    global _current
    if _current is None:
        _current = select_platform()
    return _current
