"""Platforms: the Platform interface, the built-in CPU platform and platform selection."""

from core.platforms.interface import MemoryInfo, Platform, Unavailable
from core.platforms.selection import PlatformChoice, current_platform_choice, select_platform


def current_platform() -> Platform:
    """The platform this process runs on (selected once, on first use)."""
    return current_platform_choice().platform


__all__ = [
    "MemoryInfo",
    "Platform",
    "PlatformChoice",
    "Unavailable",
    "current_platform",
    "current_platform_choice",
    "select_platform",
]
