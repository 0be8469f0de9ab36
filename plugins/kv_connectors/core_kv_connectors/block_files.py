"""One KV block of every layer in a file: written atomically, checksummed, verified on read.

A file is a header line (JSON: format version, dtype, shape, sha256 of the payload) and
the payload, the block's bytes. A file another engine is writing never shows half-written
(it is renamed into place), and a corrupted or truncated one fails `read_block` instead of
reaching the cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import torch

FORMAT = 1


class BlockFileError(ValueError):
    """A block file that cannot be trusted: missing, truncated, corrupted or of a layout
    other than the one asked for."""


def block_path(root: Path, block_hash: str) -> Path:
    """Where the block of `block_hash` (hex) lives under `root`: fanned out by its first
    two characters, so no directory holds every block."""
    return root / block_hash[:2] / f"{block_hash}.kv"


def write_block(path: Path, block: torch.Tensor) -> int:
    """Write `block` (any shape, contiguous or not) to `path` atomically; its size in bytes."""
    payload = block.contiguous().view(torch.uint8).numpy().tobytes()
    header = {
        "format": FORMAT,
        "dtype": str(block.dtype).removeprefix("torch."),
        "shape": list(block.shape),
        "sha256": hashlib.sha256(payload).hexdigest(),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(json.dumps(header).encode() + b"\n")
            f.write(payload)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path.stat().st_size


def read_block(path: Path, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """The block stored at `path`, checked against its checksum, `shape` and `dtype`;
    BlockFileError saying what is wrong otherwise."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise BlockFileError(f"{path}: {exc.strerror or exc}") from exc
    line_end = data.find(b"\n")
    try:
        header = json.loads(data[:line_end])
    except ValueError as exc:
        raise BlockFileError(f"{path}: no header") from exc
    payload = data[line_end + 1 :]
    expected = {"format": FORMAT, "dtype": str(dtype).removeprefix("torch."), "shape": list(shape)}
    for key, value in expected.items():
        if header.get(key) != value:
            raise BlockFileError(f"{path}: {key} {header.get(key)!r}, expected {value!r}")
    if hashlib.sha256(payload).hexdigest() != header.get("sha256"):
        raise BlockFileError(f"{path}: checksum mismatch (truncated or corrupted)")
    return torch.frombuffer(bytearray(payload), dtype=torch.uint8).view(dtype).reshape(shape)
