"""Off the event loop: the request work that holds the CPU (tokenizing, chat templates).

The server's event loop also answers /health, streams every response and notices client
disconnects; a 10 MB prompt tokenized on it, or a template that loops for a second, would
stall all of that. Such work runs here instead, in arrival order (as vLLM's tokenizer
executor), on one of two worker threads: one for the work of requests whose body is large,
one for the rest, so a one-line completion never queues behind six 2 MB prompts. The work
is bounded (request bodies by --max-request-body-bytes, template renders by
core.chat_template's limits), so the queue behind a slow item moves on.

Which thread: the size of the body of the request the work is for, which the server's body
limit (middleware.BodySizeLimit) notes in `request_body_bytes` as the body arrives; work for
no HTTP request (run-batch, tests) counts as small. The tokenizer may run on both threads at
once: encoding only reads it.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from typing import TypeVar

__all__ = ["LARGE_BODY_BYTES", "OffLoop", "request_body_bytes"]

T = TypeVar("T")

# A body past this is a large request's: a chat turn or a prompt of a few thousand tokens
# stays below it.
LARGE_BODY_BYTES = 256 * 1024

request_body_bytes: ContextVar[int] = ContextVar("request_body_bytes", default=0)
"""The bytes of the current HTTP request's body received so far (0: none, or no request)."""


class OffLoop:
    def __init__(self) -> None:
        self._small = ThreadPoolExecutor(max_workers=1, thread_name_prefix="core-offloop")
        self._large = ThreadPoolExecutor(max_workers=1, thread_name_prefix="core-offloop-large")

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)` on a worker thread (see the module docstring for which); its result,
        or its exception re-raised here."""
        large = request_body_bytes.get() > LARGE_BODY_BYTES
        return await asyncio.get_running_loop().run_in_executor(
            self._large if large else self._small, functools.partial(fn, *args)
        )

    def shutdown(self) -> None:
        """Drop the work not started; the items running (bounded) finish on their own."""
        for pool in (self._small, self._large):
            pool.shutdown(wait=False, cancel_futures=True)
