"""Fixtures of the compilation tests: the engine tests' tiny model, one per session."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_engine_checkpoint import write_tiny_checkpoint


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))
