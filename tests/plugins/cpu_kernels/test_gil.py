"""The C++ kernels run without the GIL: another Python thread (the scheduler under async
scheduling) runs while one multiplies."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from core.ops.quant_linear import pack

pytest.importorskip("core_cpu_kernels.ops", reason="core-cpu-kernels is not installed")
from core_cpu_kernels import _C  # noqa: E402


def _counts_during(work) -> tuple[int, float]:
    """How often a Python thread counted while `work` ran in this one, and its seconds."""
    count, started, stop = [0], threading.Event(), threading.Event()

    def counter() -> None:
        started.set()
        while not stop.is_set():
            count[0] += 1

    thread = threading.Thread(target=counter)
    thread.start()
    started.wait()
    try:
        before, start = count[0], time.perf_counter()
        work()
        return count[0] - before, time.perf_counter() - start
    finally:
        stop.set()
        thread.join()


def test_python_runs_while_a_quant_linear_multiplies():
    generator = torch.Generator().manual_seed(0)
    n, k = 8192, 4096
    qweight = pack(torch.randint(0, 16, (n, k), generator=generator, dtype=torch.uint8), 4)
    scales, mins = torch.rand(n, k // 32, generator=generator), torch.zeros(n, k // 32)
    x = torch.randn(256, k, generator=generator)  # one call of a few tenths of a second
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a core for the counter
    try:
        idle, idle_s = _counts_during(lambda: time.sleep(0.2))  # sleeping releases the GIL
        busy, busy_s = _counts_during(lambda: _C.quant_linear(x, qweight, scales, mins, 4))
    finally:
        torch.set_num_threads(threads)
    assert busy_s > 0.1  # many of the interpreter's 5 ms switch intervals
    # Holding the GIL, the kernel would let the counter run for a switch interval or two
    # around the call: a few hundredths of what it counts while this thread sleeps.
    assert busy / busy_s > 0.2 * idle / idle_s
