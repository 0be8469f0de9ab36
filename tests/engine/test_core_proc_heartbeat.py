"""The engine-core process beats from a thread of its own: a main thread that is busy (a long
step) does not stop the heartbeats."""

from __future__ import annotations

import time

import zmq

from core.engine.core_proc import HEARTBEAT, HEARTBEAT_S, _Heartbeat


def test_heartbeats_continue_while_the_main_thread_is_busy(tmp_path):
    ctx = zmq.Context()
    address = f"ipc://{tmp_path}/output"
    frontend = ctx.socket(zmq.PULL)
    frontend.bind(address)
    try:
        with _Heartbeat(ctx, address):
            deadline = time.monotonic() + 3.5 * HEARTBEAT_S
            spins = 0
            while time.monotonic() < deadline:  # pure Python: holds the GIL between switches
                spins += 1
        beats = []
        while frontend.poll(0):
            beats.append(frontend.recv_multipart())
        assert len(beats) >= 3 and all(beat == [HEARTBEAT, b""] for beat in beats)
    finally:
        frontend.close(linger=0)
        ctx.term()
