"""Off the event loop: the request work that holds the CPU (tokenizing, chat templates).

The server's event loop also answers /health, streams every response and notices client
disconnects; a 10 MB prompt tokenized on it, or a template that loops for a second, would
stall all of that. Such work runs here instead, on one worker thread, in arrival order
(as vLLM's tokenizer executor): one thread keeps the tokenizer free of concurrent use, and
the work is bounded (request bodies by --max-request-body-bytes, template renders by
core.chat_template's limits), so the queue behind a slow item moves on.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

__all__ = ["OffLoop"]

T = TypeVar("T")


class OffLoop:
    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="core-offloop")

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)` on the worker thread; its result, or its exception re-raised here."""
        return await asyncio.get_running_loop().run_in_executor(
            self._pool, functools.partial(fn, *args)
        )

    def shutdown(self) -> None:
        """Drop the work not started; the item running (bounded) finishes on its own."""
        self._pool.shutdown(wait=False, cancel_futures=True)
