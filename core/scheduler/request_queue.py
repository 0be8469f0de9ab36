"""The waiting queue: first come first served, or by priority (lower value first)."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator

from core.request import Request


class RequestQueue:
    """FCFS: arrival order, with preempted requests put back at the front.

    PRIORITY: ordered by (priority, arrival_time); a preempted request re-enters at its
    own place in that order.
    """

    def __init__(self, policy: str) -> None:
        if policy not in ("fcfs", "priority"):
            raise ValueError(f"unknown scheduling policy {policy!r}")
        self.policy = policy
        self._fifo: deque[Request] = deque()
        self._heap: list[tuple[int, float, int, Request]] = []
        self._counter = 0  # breaks ties so requests themselves are never compared

    def add(self, request: Request) -> None:
        if self.policy == "fcfs":
            self._fifo.append(request)
        else:
            self._push(request)

    def add_front(self, request: Request) -> None:
        """Put a preempted request back where it runs next (FCFS) or in its order."""
        if self.policy == "fcfs":
            self._fifo.appendleft(request)
        else:
            self._push(request)

    def peek(self) -> Request:
        return self._fifo[0] if self.policy == "fcfs" else self._heap[0][3]

    def pop(self) -> Request:
        return self._fifo.popleft() if self.policy == "fcfs" else heapq.heappop(self._heap)[3]

    def remove(self, request: Request) -> None:
        if self.policy == "fcfs":
            self._fifo.remove(request)
        else:
            self._heap = [item for item in self._heap if item[3] is not request]
            heapq.heapify(self._heap)

    def _push(self, request: Request) -> None:
        self._counter += 1
        heapq.heappush(self._heap, (request.priority, request.arrival_time, self._counter, request))

    def __len__(self) -> int:
        return len(self._fifo) if self.policy == "fcfs" else len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        if self.policy == "fcfs":
            return iter(self._fifo)
        return iter(item[3] for item in sorted(self._heap))
