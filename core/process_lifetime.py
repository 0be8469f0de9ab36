"""How core's processes end: children (the engine core, executor workers) with their
parent; the server and its engine core without a slow final garbage collection."""

from __future__ import annotations

import ctypes
import gc
import signal

__all__ = ["die_with_parent", "skip_exit_collection"]

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


def skip_exit_collection() -> None:
    """Spare this process, about to exit, the garbage collector's passes over all its
    objects during interpreter shutdown: with torch loaded they took about 0.5 s here, a
    delay every stop of `core serve` paid twice (the server, then its engine core). The
    objects die with the process. Call it last, once everything needing cleanup is done."""
    gc.freeze()
