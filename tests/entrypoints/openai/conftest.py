"""Fixtures of the server tests that send images: a local image server and a media
directory (`allowed/red.png` inside it, `secret.png` beside it, outside)."""

from __future__ import annotations

from pathlib import Path

import pytest
from image_server import RED_PNG, ImageServer


@pytest.fixture(scope="module")
def images():
    server = ImageServer()
    yield server
    server.close()


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("media")
    (root / "allowed").mkdir()
    (root / "allowed" / "red.png").write_bytes(RED_PNG)
    (root / "secret.png").write_bytes(RED_PNG)
    return root / "allowed"
