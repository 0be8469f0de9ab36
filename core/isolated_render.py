"""Chat templates from outside the deployment, rendered in a process of their own.

core.chat_template's sandbox bounds what a template builds with `*` and `+`, its output and
its time, but a template is code: filters and methods that take a size (`center`, `indent`,
`format`, `tojson(indent=...)`, `str.ljust`...) build strings as large as they are told
before any check sees them, and each such trick would need its own guard. A template a
request brings (`--trust-request-chat-template`) or a caller passes as source therefore
renders in a child process whose address space is capped at RENDER_MEMORY_BYTES above what it
needs to start: an allocation past the cap fails there (MemoryError), the server's memory never
holds it, and a child that overstays its deadline is killed. The templates of the deployment
(the model's, --chat-template) render in the calling process as before: they cost no
round trip.

The child is a fresh interpreter (`python -m core.isolated_render`), started on first use
and again after it died; requests and answers travel over its stdin and stdout as
length-prefixed JSON, which carries lone surrogates as escapes (the sandbox's own checks
then name them, as in-process).
"""

from __future__ import annotations

import json
import os
import resource
import select
import struct
import subprocess
import sys
import threading
from typing import Any

from core.chat_template import MAX_RENDER_SECONDS, render_chat_template

__all__ = ["RENDER_MEMORY_BYTES", "IsolatedRenderer", "isolated_renderer"]

# What a render may allocate on top of the child's start: 8 times the largest prompt a render
# may produce (core.chat_template.MAX_RENDER_CHARS, 8 Mi characters of up to 4 bytes).
RENDER_MEMORY_BYTES = 256 * 2**20
# The child's own deadline is the render's; this is the margin before it is killed.
_KILL_MARGIN_S = 2.0
_LENGTH = struct.Struct("<I")


class IsolatedRenderer:
    """`render(**kwargs)`: `core.chat_template.render_chat_template(**kwargs)` in the child
    process; the same result, or the same ValueError. Thread-safe: renders run one at a
    time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._child: subprocess.Popen | None = None

    def render(self, **kwargs: Any) -> str:
        try:
            request = json.dumps(kwargs).encode()
        except (TypeError, ValueError, RecursionError) as exc:
            raise ValueError(f"chat template inputs must be JSON data: {exc}") from exc
        with self._lock:
            child = self._running_child()
            _write(child.stdin, request)
            timeout = kwargs.get("max_seconds", MAX_RENDER_SECONDS) + _KILL_MARGIN_S
            answer = _read(child.stdout, timeout)
            if answer is None:  # overstayed its deadline, or died (killed for memory)
                self.close()
                raise ValueError(
                    "chat template failed to render: its process was stopped (it ran past "
                    f"{timeout:.0f} s or out of memory)"
                )
        text, error = json.loads(answer)
        if error is not None:
            raise ValueError(error)
        return text

    def close(self) -> None:
        if self._child is not None:
            self._child.kill()
            self._child.wait()
            self._child = None

    def _running_child(self) -> subprocess.Popen:
        if self._child is None or self._child.poll() is not None:
            self._child = subprocess.Popen(
                [sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE
            )
        return self._child


_renderer: IsolatedRenderer | None = None
_renderer_lock = threading.Lock()


def isolated_renderer() -> IsolatedRenderer:
    """The process's renderer (one child serves all its callers)."""
    global _renderer
    with _renderer_lock:
        if _renderer is None:
            _renderer = IsolatedRenderer()
        return _renderer


def _write(pipe: Any, payload: bytes) -> None:
    pipe.write(_LENGTH.pack(len(payload)) + payload)
    pipe.flush()


def _read(pipe: Any, timeout_s: float) -> bytes | None:
    """One message, or None when the child sent nothing within `timeout_s` or closed."""
    ready, _, _ = select.select([pipe], [], [], timeout_s)
    if not ready:
        return None
    header = pipe.read(_LENGTH.size)
    if len(header) < _LENGTH.size:
        return None
    (length,) = _LENGTH.unpack(header)
    payload = pipe.read(length)
    return payload if len(payload) == length else None


def _serve() -> None:
    """The child: cap the address space, then render each request until stdin closes."""
    from core.process_lifetime import die_with_parent

    die_with_parent()
    with open("/proc/self/statm") as statm:
        start = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    limit = start + RENDER_MEMORY_BYTES
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    source, sink = sys.stdin.buffer, sys.stdout.buffer
    while (request := _read(source, timeout_s=None)) is not None:
        try:
            answer = (render_chat_template(**json.loads(request)), None)
        except ValueError as exc:
            answer = (None, str(exc))
        except MemoryError:
            answer = (None, "chat template failed to render: it ran out of memory")
        _write(sink, json.dumps(answer).encode())


if __name__ == "__main__":
    _serve()
