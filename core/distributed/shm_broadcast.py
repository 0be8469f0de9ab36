"""A one-writer, many-reader broadcast queue over a shared-memory ring buffer.

The multiprocess executor sends each step's message (a `SchedulerOutput`, a method call)
from the engine core to every worker process on the host through a `MessageQueue`: the
writer pickles the object once into shared memory and each reader copies it out, with no
socket and no per-reader copy on the writer's side.

Waiting polls the ring's flags: a few hundred `sched_yield`s first (a message sent right
after the previous one, the next step, is picked up within microseconds), then sleeps
growing from 0.1 ms to 1 ms, so an idle reader costs a few percent of a core, not a whole one.
"""

from __future__ import annotations

import os
import pickle
import struct
import sys
import time
import weakref
from collections.abc import Callable
from contextlib import contextmanager
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import msgspec

__all__ = ["MessageQueue", "MessageQueueHandle", "ShmRingBuffer"]

_HEADER = struct.Struct("<QB")  # a chunk's piece length in bytes, 1 when more pieces follow
_SPIN_POLLS = 300  # polls that only yield the CPU before the first sleep
_MIN_SLEEP_S = 1e-4
_MAX_SLEEP_S = 1e-3


class ShmRingBuffer:
    """`max_chunks` chunks of `max_chunk_bytes` payload in one shared-memory segment.

    Layout: the chunks, then one metadata area per chunk. A chunk is a header (the length of
    the piece it holds, whether more pieces of the same message follow) and the payload; a
    chunk's metadata is a "written" flag byte, then one "read" flag byte per reader.

    Protocol (one writer and `n_readers` readers, each walking the chunks round robin):
    - the writer may fill a chunk when it was never written or every reader has read it
      (`readers_pending` is empty); it writes header and payload, clears the read flags,
      then sets the written flag;
    - reader r may read a chunk when it is written and r's read flag is clear
      (`is_readable`); it copies the piece out, then sets its read flag.

    Memory ordering: a flag is stored only after the bytes it publishes, each store a
    separate C call of the interpreter (a compiler cannot move one past the other), and x86
    keeps stores in program order for other cores (TSO), so a reader that sees a flag sees
    the bytes before it. Weakly ordered CPUs (ARM) give no such guarantee.

    The process that creates the segment owns it: `close` (or garbage collection, or exit)
    unlinks it there; attached processes only unmap it.
    """

    def __init__(
        self, shm: SharedMemory, n_readers: int, max_chunk_bytes: int, max_chunks: int, owner: bool
    ) -> None:
        self.shm = shm
        self.n_readers = n_readers
        self.max_chunk_bytes = max_chunk_bytes
        self.max_chunks = max_chunks
        self._buf = shm.buf
        self._chunk_stride = _HEADER.size + max_chunk_bytes
        self._metadata_start = max_chunks * self._chunk_stride
        unlink_pid = os.getpid() if owner else None  # a forked child never unlinks
        self._finalizer = weakref.finalize(self, _release_segment, shm, unlink_pid)

    @staticmethod
    def segment_bytes(n_readers: int, max_chunk_bytes: int, max_chunks: int) -> int:
        """Size of the segment holding this ring."""
        return max_chunks * (_HEADER.size + max_chunk_bytes + 1 + n_readers)

    @classmethod
    def create(
        cls, n_readers: int, max_chunk_bytes: int, max_chunks: int, name: str | None = None
    ) -> ShmRingBuffer:
        """A new zeroed segment (every chunk unwritten), owned by this process."""
        size = cls.segment_bytes(n_readers, max_chunk_bytes, max_chunks)
        shm = SharedMemory(name=name, create=True, size=size)
        return cls(shm, n_readers, max_chunk_bytes, max_chunks, owner=True)

    @classmethod
    def attach(
        cls, name: str, n_readers: int, max_chunk_bytes: int, max_chunks: int
    ) -> ShmRingBuffer:
        """The existing segment `name`; FileNotFoundError when it is gone."""
        shm = _attach_untracked(name)
        needed = cls.segment_bytes(n_readers, max_chunk_bytes, max_chunks)
        if shm.size < needed:
            shm.close()
            raise ValueError(f"shared memory {name!r} holds {shm.size} bytes, the ring {needed}")
        return cls(shm, n_readers, max_chunk_bytes, max_chunks, owner=False)

    def readers_pending(self, chunk: int) -> list[int]:
        """Readers that have yet to read `chunk`; empty when the writer may fill it."""
        start = self._metadata_start + chunk * (1 + self.n_readers)
        if not self._buf[start]:
            return []
        flags = self._buf[start + 1 : start + 1 + self.n_readers].tobytes()
        return [rank for rank, flag in enumerate(flags) if not flag]

    def is_readable(self, chunk: int, reader_rank: int) -> bool:
        """Whether `chunk` holds a piece that `reader_rank` has not read yet."""
        start = self._metadata_start + chunk * (1 + self.n_readers)
        return bool(self._buf[start]) and not self._buf[start + 1 + reader_rank]

    def write(self, chunk: int, piece: memoryview, more: bool) -> None:
        """Fill `chunk` (free: see `readers_pending`) with `piece` and publish it."""
        offset = chunk * self._chunk_stride
        _HEADER.pack_into(self._buf, offset, len(piece), more)
        payload_start = offset + _HEADER.size
        self._buf[payload_start : payload_start + len(piece)] = piece
        start = self._metadata_start + chunk * (1 + self.n_readers)
        self._buf[start + 1 : start + 1 + self.n_readers] = bytes(self.n_readers)
        self._buf[start] = 1  # last: publishes the payload and the cleared read flags

    def read(self, chunk: int, reader_rank: int) -> tuple[bytes, bool]:
        """Copy out the piece of `chunk` (readable: see `is_readable`) and mark it read.

        Returns the piece and whether more pieces of the same message follow.
        """
        offset = chunk * self._chunk_stride
        nbytes, more = _HEADER.unpack_from(self._buf, offset)
        payload_start = offset + _HEADER.size
        piece = self._buf[payload_start : payload_start + nbytes].tobytes()
        start = self._metadata_start + chunk * (1 + self.n_readers)
        self._buf[start + 1 + reader_rank] = 1  # last: the writer may reuse the chunk now
        return piece, bool(more)

    def close(self) -> None:
        """Unmap the segment; the owner also unlinks it. Idempotent."""
        self._finalizer()


def _release_segment(shm: SharedMemory, unlink_pid: int | None) -> None:
    shm.close()
    if unlink_pid == os.getpid():
        shm.unlink()


def _attach_untracked(name: str) -> SharedMemory:
    """Map segment `name` without handing it to this process's resource tracker.

    Before Python 3.13 attaching registers the segment with the tracker, which unlinks it
    when this process exits (under the owner's feet, with a "leaked" warning) unless the
    tracker is the owner's own, shared through multiprocessing; unregistering instead would
    drop the owner's registration from a shared tracker. Not registering is right in both
    cases: the owner alone is responsible for the segment.
    """
    if sys.version_info >= (3, 13):
        return SharedMemory(name=name, track=False)
    with _tracker_registration_off():
        return SharedMemory(name=name)


@contextmanager
def _tracker_registration_off():
    register = resource_tracker.register
    resource_tracker.register = lambda name, rtype: None
    try:
        yield
    finally:
        resource_tracker.register = register


class MessageQueueHandle(msgspec.Struct, frozen=True):
    """What a reader process needs to attach to a `MessageQueue` (picklable, msgspec-able)."""

    name: str
    n_readers: int
    max_chunk_bytes: int
    max_chunks: int


class MessageQueue:
    """Broadcast of picklable objects from one writer to `n_readers` readers on this host.

    The writer builds it (`MessageQueue(n_readers, ...)`) and passes `handle()` to the reader
    processes, which attach with `MessageQueue.create_reader(handle, reader_rank)`. Every
    reader receives every object, in the order the writer enqueued them. An object is
    pickled (protocol 5) and sent in as many consecutive chunks as it needs, so its size is
    not bounded by `max_chunk_bytes`; `max_chunks` bounds how far the writer runs ahead of
    the slowest reader.

    Timeouts: `enqueue` raises TimeoutError when a reader stops reading (a dead worker),
    `dequeue` when nothing arrives. A dequeue that times out part-way through a message
    resumes it on the next call. An enqueue that times out before writing anything leaves
    the queue usable; one that times out part-way through a message leaves the readers
    holding half of it, so the queue refuses further enqueues.
    """

    def __init__(
        self,
        n_readers: int,
        max_chunk_bytes: int = 1 << 20,
        max_chunks: int = 10,
        name: str | None = None,
    ) -> None:
        for field, value in (
            ("n_readers", n_readers),
            ("max_chunk_bytes", max_chunk_bytes),
            ("max_chunks", max_chunks),
        ):
            if value < 1:
                raise ValueError(f"MessageQueue: {field} must be at least 1, got {value}")
        self._setup(ShmRingBuffer.create(n_readers, max_chunk_bytes, max_chunks, name), None)

    @classmethod
    def create_reader(cls, handle: MessageQueueHandle, reader_rank: int) -> MessageQueue:
        """Attach to the queue of `handle` as reader `reader_rank` (0 <= rank < n_readers)."""
        if not 0 <= reader_rank < handle.n_readers:
            raise ValueError(
                f"MessageQueue: reader_rank must be in [0, {handle.n_readers}), got {reader_rank}"
            )
        ring = ShmRingBuffer.attach(
            handle.name, handle.n_readers, handle.max_chunk_bytes, handle.max_chunks
        )
        queue = cls.__new__(cls)
        queue._setup(ring, reader_rank)
        return queue

    def _setup(self, ring: ShmRingBuffer, reader_rank: int | None) -> None:
        self._ring = ring
        self.reader_rank = reader_rank  # None: the writer
        self._chunk = 0  # the next chunk this end writes or reads
        self._partial = bytearray()  # a reader's pieces of a message not yet complete
        self._broken = False  # a writer's enqueue stopped part-way through a message

    def handle(self) -> MessageQueueHandle:
        """The description readers attach with."""
        ring = self._ring
        return MessageQueueHandle(
            name=ring.shm.name,
            n_readers=ring.n_readers,
            max_chunk_bytes=ring.max_chunk_bytes,
            max_chunks=ring.max_chunks,
        )

    def enqueue(self, obj: Any, timeout: float | None = None) -> None:
        """Send `obj` to every reader; TimeoutError when the readers do not free the chunks
        it needs within `timeout` seconds (None: wait forever)."""
        if self.reader_rank is not None:
            raise RuntimeError(f"MessageQueue: reader {self.reader_rank} cannot enqueue")
        if self._broken:
            raise RuntimeError(
                "MessageQueue: an earlier enqueue timed out part-way through a message and "
                "the readers are out of step; close this queue"
            )
        payload = memoryview(pickle.dumps(obj, protocol=5))
        deadline = _deadline(timeout)
        size = self._ring.max_chunk_bytes
        for start in range(0, len(payload), size):
            self._wait_chunk_free(deadline, timeout, sent_any=start > 0)
            more = start + size < len(payload)
            self._ring.write(self._chunk, payload[start : start + size], more)
            self._chunk = (self._chunk + 1) % self._ring.max_chunks

    def _wait_chunk_free(
        self, deadline: float | None, timeout: float | None, sent_any: bool
    ) -> None:
        if _wait_until(lambda: not self._ring.readers_pending(self._chunk), deadline):
            return
        self._broken = sent_any
        pending = self._ring.readers_pending(self._chunk)
        raise TimeoutError(
            f"MessageQueue: readers {pending} did not read chunk {self._chunk} within {timeout} s"
        )

    def dequeue(self, timeout: float | None = None) -> Any:
        """The next object the writer enqueued; TimeoutError when it has not fully arrived
        within `timeout` seconds (None: wait forever)."""
        if self.reader_rank is None:
            raise RuntimeError("MessageQueue: the writer cannot dequeue")
        deadline = _deadline(timeout)
        while True:
            piece, more = self._read_piece(deadline, timeout)
            if not more:
                break
            self._partial += piece  # kept across a timeout: the next call resumes
        if not self._partial:
            return pickle.loads(piece)
        self._partial += piece
        message, self._partial = self._partial, bytearray()
        return pickle.loads(message)

    def _read_piece(self, deadline: float | None, timeout: float | None) -> tuple[bytes, bool]:
        chunk, rank = self._chunk, self.reader_rank
        if not _wait_until(lambda: self._ring.is_readable(chunk, rank), deadline):
            raise TimeoutError(f"MessageQueue: no message within {timeout} s")
        self._chunk = (chunk + 1) % self._ring.max_chunks
        return self._ring.read(chunk, rank)

    def close(self) -> None:
        """Detach; the writer also removes the segment. Idempotent."""
        self._ring.close()


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


def _wait_until(ready: Callable[[], bool], deadline: float | None) -> bool:
    """Poll `ready` until it holds (True) or `deadline` (time.monotonic) passes (False).

    Polls at least once, so a zero timeout is a non-blocking try.
    """
    polls = 0
    sleep_s = _MIN_SLEEP_S
    while not ready():
        if deadline is not None and time.monotonic() >= deadline:
            return False
        if polls < _SPIN_POLLS:
            polls += 1
            os.sched_yield()
        else:
            time.sleep(sleep_s)
            sleep_s = min(2 * sleep_s, _MAX_SLEEP_S)
    return True
