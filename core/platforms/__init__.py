"""Platforms: the Platform interface, the built-in CPU platform and platform selection.

Import-light: platform probes import `Unavailable` from here and must not pull in torch,
so everything else is imported on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from core.platforms.unavailable import Unavailable

if TYPE_CHECKING:
    from core.platforms.interface import MemoryInfo, Platform
    from core.platforms.selection import PlatformChoice, current_platform_choice, select_platform

_LAZY = {
    "MemoryInfo": "core.platforms.interface",
    "Platform": "core.platforms.interface",
    "PlatformChoice": "core.platforms.selection",
    "current_platform_choice": "core.platforms.selection",
    "select_platform": "core.platforms.selection",
}


def current_platform() -> Platform:
    """The platform this process runs on (selected once, on first use)."""
    from core.platforms.selection import current_platform_choice

    return current_platform_choice().platform


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'core.platforms' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)


__all__ = [
    "MemoryInfo",
    "Platform",
    "PlatformChoice",
    "Unavailable",
    "current_platform",
    "current_platform_choice",
    "select_platform",
]
