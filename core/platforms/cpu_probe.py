"""The probe of the built-in CPU platform (`core.platforms` entry point `cpu`).

Kept apart from `core.platforms.cpu` so probing imports nothing heavy: the platform class
(and torch) are imported only once the CPU platform is chosen.
"""

from __future__ import annotations


def probe() -> str:
    """The CPU is always available."""
    return "core.platforms.cpu.CpuPlatform"
