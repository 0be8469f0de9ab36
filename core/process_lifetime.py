"""How core's child processes (the engine core, executor workers) end with their parent."""

from __future__ import annotations

import ctypes
import signal

__all__ = ["die_with_parent"]

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask Linux to send this process SIGTERM when its parent dies, so a killed server
    or engine core leaves no orphan. Elsewhere a no-op: the parent's shutdown still
    terminates its children."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass
