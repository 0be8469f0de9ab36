"""A JSON file of measurements keyed by what they depend on, in core's cache directory.

Choices core makes by measuring the user's machine (the CPU's default dtype, which kernel
serves each op) are saved here so that the measurement runs once per key, not at every
start. The cache only saves time: a missing, unreadable or corrupt file reads as empty
(with a warning) and a file that cannot be written is skipped (with a warning).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path

from core import envs

logger = logging.getLogger(__name__)


def cache_path(file_name: str) -> Path:
    """Where the measurements named `file_name` live (CORE_CACHE_DIR, see core.envs)."""
    return envs.cache_dir() / file_name


def load_entries(path: Path) -> dict[str, object]:
    """The file's entries by key; empty when it is absent or unreadable."""
    try:
        entries = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        logger.warning("ignoring the measurement cache %s (%s); measuring again", path, exc)
        return {}
    if not isinstance(entries, dict):
        logger.warning("ignoring the measurement cache %s (not a JSON object)", path)
        return {}
    return entries


def save_entries(path: Path, entries: dict[str, object]) -> bool:
    """Write the file atomically (a temporary file renamed over it, so a reader, another
    process measuring at the same time included, never sees half a file); False, with a
    warning, when it cannot be written."""
    temporary = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "w") as f:
            json.dump(entries, f, indent=2, sort_keys=True)
        os.replace(temporary, path)
        return True
    except OSError as exc:
        logger.warning("cannot write the measurement cache %s (%s)", path, exc)
        if temporary is not None:
            Path(temporary).unlink(missing_ok=True)
        return False
