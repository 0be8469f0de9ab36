"""`benchmarks` is no installed package: it is imported from the repository root."""

from __future__ import annotations

import concurrent.futures
import sys
from pathlib import Path

import pytest

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


class _InProcess(concurrent.futures.ThreadPoolExecutor):
    """The spawned child, as a thread of this process."""

    def __init__(self, max_workers: int, mp_context: object) -> None:
        super().__init__(max_workers)


@pytest.fixture
def children_in_process(monkeypatch) -> None:
    """The benchmark's spawned children run as threads of the test's process."""
    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", _InProcess)
