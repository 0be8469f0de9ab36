"""The shared-memory broadcast queue: order, large messages, wrap-around, timeouts, idle CPU
and the segment's lifetime, with readers in real ("spawn") processes where it matters."""

from __future__ import annotations

import gc
import multiprocessing
import pickle
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path

import msgspec
import numpy as np
import pytest

from core.distributed.shm_broadcast import MessageQueue, MessageQueueHandle
from core.sampling_params import SamplingParams
from core.worker.contract import NewRequestData, SchedulerOutput

WAIT_S = 30  # generous bound on any wait that only a broken queue (or a hung child) exceeds


def _segment_exists(name: str) -> bool:
    return Path("/dev/shm", name).exists()


def _read_until_none(handle: MessageQueueHandle, rank: int, conn: Connection, delay_s: float):
    """Reader process: dequeue until None (pausing `delay_s` after each), send back the rest."""
    queue = MessageQueue.create_reader(handle, rank)
    received = []
    while (obj := queue.dequeue(timeout=WAIT_S)) is not None:
        received.append(obj)
        time.sleep(delay_s)
    queue.close()
    conn.send(received)
    conn.close()


class Queues:
    """Writers and in-process readers of one test, closed at its end."""

    def __init__(self) -> None:
        self.writers: list[MessageQueue] = []
        self.readers: list[MessageQueue] = []

    def writer(self, n_readers: int, **kwargs) -> MessageQueue:
        self.writers.append(MessageQueue(n_readers, **kwargs))
        return self.writers[-1]

    def reader(self, handle: MessageQueueHandle, rank: int) -> MessageQueue:
        self.readers.append(MessageQueue.create_reader(handle, rank))
        return self.readers[-1]


@pytest.fixture
def queues():
    made = Queues()
    yield made
    for reader in made.readers:
        reader.close()
    for writer in made.writers:
        name = writer.handle().name
        writer.close()
        assert not _segment_exists(name)


@pytest.fixture
def spawn_readers():
    """start(handle, delay_s) -> one connection per reader rank, each receiving the list of
    objects that reader dequeued before None. Every process must exit cleanly."""
    context = multiprocessing.get_context("spawn")
    processes = []

    def start(handle: MessageQueueHandle, delay_s: float = 0.0) -> list[Connection]:
        connections = []
        for rank in range(handle.n_readers):
            receiver, sender = context.Pipe(duplex=False)
            process = context.Process(target=_read_until_none, args=(handle, rank, sender, delay_s))
            process.start()
            sender.close()
            processes.append(process)
            connections.append(receiver)
        return connections

    yield start
    for process in processes:
        process.join(timeout=WAIT_S)
        if process.is_alive():
            process.kill()
            process.join()
    assert [process.exitcode for process in processes] == [0] * len(processes)


def _broadcast(writer: MessageQueue, objects: list) -> None:
    for obj in [*objects, None]:
        writer.enqueue(obj, timeout=WAIT_S)


def test_two_reader_processes_receive_100_messages_in_order(queues, spawn_readers):
    writer = queues.writer(2, max_chunk_bytes=256, max_chunks=4)
    connections = spawn_readers(writer.handle())
    _broadcast(writer, list(range(100)))
    assert [connection.recv() for connection in connections] == [list(range(100))] * 2


def test_slow_readers_keep_order_as_the_writer_wraps_around_the_ring(queues, spawn_readers):
    writer = queues.writer(2, max_chunk_bytes=64, max_chunks=2)
    connections = spawn_readers(writer.handle(), delay_s=0.002)
    messages = [f"message {i}" for i in range(30)]  # 31 with the None: the ring holds 2
    _broadcast(writer, messages)
    assert [connection.recv() for connection in connections] == [messages] * 2


def test_message_larger_than_the_whole_ring_arrives_whole(queues, spawn_readers):
    writer = queues.writer(2, max_chunk_bytes=1000, max_chunks=3)
    array = np.arange(5000, dtype=np.int64)  # 40 kB: about 40 chunks, the ring holds 3
    connections = spawn_readers(writer.handle())
    _broadcast(writer, [array, "after"])
    for connection in connections:
        received_array, after = connection.recv()
        np.testing.assert_array_equal(received_array, array)
        assert after == "after"


def test_dicts_arrays_and_scheduler_outputs_round_trip_to_a_process(queues, spawn_readers):
    new_request = NewRequestData(
        req_id="a",
        prompt_token_ids=[1, 2, 3],
        sampling_params=SamplingParams(max_tokens=4),
        block_ids=([0, 1],),
        num_computed_tokens=0,
    )
    scheduler_output = SchedulerOutput(
        scheduled_new_reqs=[new_request],
        num_scheduled_tokens={"a": 3},
        total_num_scheduled_tokens=3,
        finished_req_ids={"b"},
    )
    mapping = {"method": "execute_model", "args": (1, 2.5, None), "kwargs": {"k": [b"v"]}}
    array = np.array([[1.5, -2.0], [0.25, 8.0]], dtype=np.float32)
    writer = queues.writer(1)
    (connection,) = spawn_readers(writer.handle())
    _broadcast(writer, [mapping, array, scheduler_output])
    received_mapping, received_array, received_output = connection.recv()
    assert received_mapping == mapping
    assert received_array.dtype == np.float32
    np.testing.assert_array_equal(received_array, array)
    assert received_output == scheduler_output


@pytest.mark.parametrize(("overflow", "num_chunks"), [(0, 1), (1, 2)])
def test_a_message_takes_as_many_chunks_as_its_pickle_needs(queues, overflow, num_chunks):
    obj = b"x" * 100
    pickled_bytes = len(pickle.dumps(obj, protocol=5))
    writer = queues.writer(1, max_chunk_bytes=pickled_bytes - overflow, max_chunks=2)
    reader = queues.reader(writer.handle(), 0)
    writer.enqueue(obj, timeout=0)
    next_fits = num_chunks == 1  # a second message needs the ring's other chunk free
    if next_fits:
        writer.enqueue("next", timeout=0)
    else:
        with pytest.raises(TimeoutError):
            writer.enqueue("next", timeout=0)
    assert reader.dequeue(timeout=0) == obj
    if next_fits:
        assert reader.dequeue(timeout=0) == "next"


def test_dequeue_times_out_when_nothing_is_sent_and_stays_usable(queues):
    writer = queues.writer(1)
    reader = queues.reader(writer.handle(), 0)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="no message within 0.2 s"):
        reader.dequeue(timeout=0.2)
    assert 0.2 <= time.monotonic() - started < 0.2 + WAIT_S
    writer.enqueue("late")
    assert reader.dequeue(timeout=0) == "late"


def test_dequeue_timing_out_part_way_through_a_message_resumes_it(queues):
    writer = queues.writer(2, max_chunk_bytes=64, max_chunks=2)
    fast, slow = (queues.reader(writer.handle(), rank) for rank in range(2))
    message = bytes(range(256)) * 2  # about 9 chunks: the writer stalls until `slow` reads
    sending = threading.Thread(target=writer.enqueue, args=(message, WAIT_S), daemon=True)
    sending.start()
    with pytest.raises(TimeoutError):
        fast.dequeue(timeout=0.5)  # reads the 2 chunks written, then waits for the third
    slow_received = []
    reading = threading.Thread(target=lambda: slow_received.append(slow.dequeue(WAIT_S)))
    reading.start()
    assert fast.dequeue(timeout=WAIT_S) == message
    reading.join()
    sending.join()
    assert slow_received == [message]


def test_enqueue_times_out_naming_the_reader_that_never_reads(queues):
    writer = queues.writer(2, max_chunk_bytes=64, max_chunks=2)
    reader0 = queues.reader(writer.handle(), 0)
    for i in range(2):
        writer.enqueue(i, timeout=0)
        assert reader0.dequeue(timeout=0) == i
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"readers \[1\] did not read chunk 0 within 0.2 s"):
        writer.enqueue(2, timeout=0.2)
    assert time.monotonic() - started >= 0.2
    reader1 = queues.reader(writer.handle(), 1)  # nothing of message 2 was written
    assert [reader1.dequeue(timeout=0) for _ in range(2)] == [0, 1]
    writer.enqueue(2, timeout=0)
    assert [reader0.dequeue(timeout=0), reader1.dequeue(timeout=0)] == [2, 2]


def test_enqueue_timing_out_part_way_through_a_message_refuses_more(queues):
    writer = queues.writer(1, max_chunk_bytes=64, max_chunks=2)
    with pytest.raises(TimeoutError):
        writer.enqueue(bytes(1000), timeout=0.1)  # 2 of its 16 chunks written
    with pytest.raises(RuntimeError, match="out of step"):
        writer.enqueue("next", timeout=0)


def test_idle_reader_waiting_one_second_uses_little_cpu(queues):
    writer = queues.writer(1)
    reader = queues.reader(writer.handle(), 0)
    cpu_started = time.thread_time()
    with pytest.raises(TimeoutError):
        reader.dequeue(timeout=1.0)
    assert time.thread_time() - cpu_started < 0.3


def test_writer_close_removes_the_segment_and_reader_close_does_not():
    writer = MessageQueue(1)
    handle = writer.handle()
    reader = MessageQueue.create_reader(handle, 0)
    reader.close()
    assert _segment_exists(handle.name)
    writer.enqueue("still open", timeout=0)
    writer.close()
    writer.close()  # idempotent
    assert not _segment_exists(handle.name)
    with pytest.raises(FileNotFoundError):
        MessageQueue.create_reader(handle, 0)


def test_dropping_the_writer_removes_the_segment():
    writer = MessageQueue(1)
    name = writer.handle().name
    del writer
    gc.collect()
    assert not _segment_exists(name)


def test_reader_in_an_unrelated_process_leaves_the_segment_alone(queues):
    # A process not started by multiprocessing has a resource tracker of its own, which would
    # unlink a segment it was told about when that process exits.
    writer = queues.writer(1)
    writer.enqueue("hello")
    code = (
        "import sys, msgspec\n"
        "from core.distributed.shm_broadcast import MessageQueue, MessageQueueHandle\n"
        "handle = msgspec.json.decode(sys.argv[1], type=MessageQueueHandle)\n"
        "reader = MessageQueue.create_reader(handle, 0)\n"
        "print(reader.dequeue(timeout=10))\n"
        "reader.close()\n"
    )
    handle_json = msgspec.json.encode(writer.handle()).decode()
    result = subprocess.run(
        [sys.executable, "-c", code, handle_json], capture_output=True, text=True, timeout=WAIT_S
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, "hello\n", "")
    assert _segment_exists(writer.handle().name)


@pytest.mark.parametrize("field", ["n_readers", "max_chunk_bytes", "max_chunks"])
def test_sizes_below_one_are_refused_naming_the_field(field):
    sizes = {"n_readers": 1, field: 0}
    with pytest.raises(ValueError, match=f"{field} must be at least 1, got 0"):
        MessageQueue(**sizes)


@pytest.mark.parametrize("rank", [-1, 2])
def test_reader_rank_outside_the_readers_is_refused(queues, rank):
    writer = queues.writer(2)
    with pytest.raises(ValueError, match=rf"reader_rank must be in \[0, 2\), got {rank}"):
        MessageQueue.create_reader(writer.handle(), rank)


def test_each_end_refuses_the_other_ends_operation(queues):
    writer = queues.writer(1)
    reader = queues.reader(writer.handle(), 0)
    with pytest.raises(RuntimeError, match="writer cannot dequeue"):
        writer.dequeue(timeout=0)
    with pytest.raises(RuntimeError, match="reader 0 cannot enqueue"):
        reader.enqueue("x")
