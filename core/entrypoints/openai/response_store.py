"""The Responses API's store: the responses kept for retrieval, cancellation and
continuation (``previous_response_id``), in this server's memory.

It is bounded twice, oldest evicted first (insertion order is age order):

- by count, MAX_STORED_RESPONSES: what bounds memory. A stored response holds its output
  and its conversation (the messages of its prompt, shared with the responses continuing
  it, not copied): at most a context's worth of new text each. A thousand is the bound
  proposed for vLLM's own store.
- by age, MAX_STORED_AGE_S: what returns that memory on a server with little traffic,
  where the count is never reached. A day keeps a conversation resumable the same day; an
  in-memory store loses everything at a restart anyway, so a longer promise would be empty.

vLLM names no flag for either bound (its store is unbounded, behind an environment
variable), hence module constants. An evicted or expired response is unknown: retrieving,
cancelling or continuing it is a 404, as for one never stored. A response still in progress
is evicted like any other; it runs to its end, unstored.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["MAX_STORED_AGE_S", "MAX_STORED_RESPONSES", "ResponseStore"]

MAX_STORED_RESPONSES = 1000
MAX_STORED_AGE_S = 24 * 3600.0

T = TypeVar("T")


class ResponseStore(Generic[T]):
    """Values by response id, at most `max_count` of them and none older than
    `max_age_s` seconds of `clock` (a monotonic clock; injectable for tests)."""

    def __init__(
        self,
        max_count: int = MAX_STORED_RESPONSES,
        max_age_s: float = MAX_STORED_AGE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_count < 1 or max_age_s <= 0:
            raise ValueError("a response store must keep at least one response for some time")
        self.max_count = max_count
        self.max_age_s = max_age_s
        self._clock = clock
        self._entries: OrderedDict[str, tuple[float, T]] = OrderedDict()

    def add(self, response_id: str, value: T) -> None:
        """Keep `value` as the newest entry, evicting the oldest past either bound."""
        self._entries.pop(response_id, None)
        self._entries[response_id] = (self._clock(), value)
        self._evict_expired()
        while len(self._entries) > self.max_count:
            self._entries.popitem(last=False)

    def get(self, response_id: str) -> T | None:
        """The value stored as `response_id`; None when it never was, or is gone."""
        self._evict_expired()
        entry = self._entries.get(response_id)
        return None if entry is None else entry[1]

    def __len__(self) -> int:
        self._evict_expired()
        return len(self._entries)

    def _evict_expired(self) -> None:
        oldest_kept = self._clock() - self.max_age_s
        while self._entries:
            added_at, _ = next(iter(self._entries.values()))
            if added_at > oldest_kept:
                return
            self._entries.popitem(last=False)
