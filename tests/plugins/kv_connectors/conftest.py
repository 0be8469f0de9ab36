from __future__ import annotations

from pathlib import Path

import pytest
from tiny_engine_checkpoint import write_tiny_checkpoint


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """The engine tests' tiny model, written once per module."""
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))
