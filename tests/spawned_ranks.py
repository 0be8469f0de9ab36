"""Real gloo ranks for tests: one spawned process per rank, each running `fn(rank, *args)`,
killed if they have not all finished by the deadline (a hung collective fails the test
instead of hanging it)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import torch.multiprocessing as mp


def run_ranks(fn: Callable[..., None], args: tuple[Any, ...], nprocs: int, deadline_s: float):
    context = mp.start_processes(fn, args=args, nprocs=nprocs, join=False, start_method="spawn")
    deadline = time.monotonic() + deadline_s
    try:
        while not context.join(timeout=1.0):
            if time.monotonic() > deadline:
                pytest.fail(f"the ranks did not finish within {deadline_s} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
            process.join()
