"""The header of a GGUF file: its key/value metadata and its tensor table, never tensor data.

gguf.GGUFReader builds numpy views for every metadata array element and every tensor: over a
second for SmolLM2's 49k-token vocabulary. The tokenizer and the config need only the header,
read here sequentially in a few hundredths of a second; GGUFReader is left to tensor data.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUF_MAGIC, GGMLQuantizationType, GGUFReader, GGUFValueType

__all__ = ["GGUFHeader", "GGUFTensorInfo", "read_gguf_header", "read_gguf_metadata"]

_GGUF_VERSIONS = (2, 3)
_DEFAULT_ALIGNMENT = 32  # the GGUF format's, when general.alignment is absent


@dataclass(frozen=True)
class GGUFTensorInfo:
    """One entry of a GGUF file's tensor table."""

    name: str
    shape: tuple[int, ...]  # GGUF `ne` order: the fastest-varying dimension first
    tensor_type: GGMLQuantizationType


@dataclass(frozen=True)
class GGUFHeader:
    """A GGUF file's metadata (arrays as lists) and its tensors by name, in file order."""

    metadata: dict[str, Any]
    tensors: dict[str, GGUFTensorInfo]


def read_gguf_metadata(path: str | Path) -> dict[str, Any]:
    """Every metadata key of a little-endian GGUF v2/v3 file; arrays come back as lists.

    Reads only the key/value section. Raises ValueError naming the file when it is missing,
    not GGUF, truncated or corrupt (e.g. a key that appears twice).
    """
    gguf_path = Path(path)
    with _mapped(gguf_path) as buf:
        _, num_kv = _read_counts(buf, gguf_path)
        metadata, _ = _read_key_values(buf, num_kv, gguf_path)
    return metadata


def read_gguf_header(path: str | Path) -> GGUFHeader:
    """The metadata and tensor table of a little-endian GGUF v2/v3 file.

    Checks that every tensor's data lies within the file, so a file cut short fails here.
    Raises ValueError naming the file and the problem (missing, not GGUF, truncated,
    duplicate key or tensor name, unknown tensor type, bad alignment).
    """
    gguf_path = Path(path)
    with _mapped(gguf_path) as buf:
        num_tensors, num_kv = _read_counts(buf, gguf_path)
        metadata, pos = _read_key_values(buf, num_kv, gguf_path)
        alignment = _alignment(metadata, gguf_path)
        tensors = _read_tensor_table(buf, pos, num_tensors, alignment, gguf_path)
    return GGUFHeader(metadata, tensors)


@contextlib.contextmanager
def _mapped(path: Path) -> Iterator[mmap.mmap]:
    """The file's bytes once its magic is checked; a read past the end becomes ValueError."""
    if not path.is_file():
        raise ValueError(f"GGUF file {path} does not exist")
    with open(path, "rb") as file:
        if file.read(4) != struct.pack("<I", GGUF_MAGIC):
            raise ValueError(f"{path} is not a GGUF file (bad magic bytes)")
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            try:
                yield buf
            except (struct.error, UnicodeDecodeError) as e:
                raise ValueError(f"{path} has a truncated or corrupt GGUF header: {e}") from e


def _read_counts(buf: mmap.mmap, path: Path) -> tuple[int, int]:
    """The number of tensors and of metadata keys, once the version is checked."""
    version, num_tensors, num_kv = struct.unpack_from("<IQQ", buf, 4)
    if version not in _GGUF_VERSIONS:
        raise ValueError(f"{path} is GGUF version {version}; supported: {_GGUF_VERSIONS}")
    return num_tensors, num_kv


def _read_key_values(buf: mmap.mmap, num_kv: int, path: Path) -> tuple[dict[str, Any], int]:
    """The metadata, and the offset of the tensor table that follows it."""
    metadata: dict[str, Any] = {}
    pos = 24
    for _ in range(num_kv):
        key, pos = _read_string(buf, pos)
        if key in metadata:
            raise ValueError(f"{path}: GGUF metadata key {key!r} appears twice")
        (value_type,) = struct.unpack_from("<I", buf, pos)
        metadata[key], pos = _read_value(buf, pos + 4, value_type, key)
    return metadata, pos


def _read_string(buf: mmap.mmap, pos: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<Q", buf, pos)
    end = pos + 8 + length
    if end > len(buf):
        raise struct.error("string runs past the end of the file")
    return buf[pos + 8 : end].decode("utf-8"), end


def _read_value(buf: mmap.mmap, pos: int, value_type: int, key: str) -> tuple[Any, int]:
    if value_type == GGUFValueType.STRING:
        return _read_string(buf, pos)
    if value_type == GGUFValueType.ARRAY:
        item_type, count = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        if item_type == GGUFValueType.STRING:
            items = []
            for _ in range(count):
                item, pos = _read_string(buf, pos)
                items.append(item)
            return items, pos
        return _read_numbers(buf, pos, item_type, count, key)
    (value,), pos = _read_numbers(buf, pos, value_type, 1, key)
    return value, pos


def _read_numbers(
    buf: mmap.mmap, pos: int, value_type: int, count: int, key: str
) -> tuple[list[Any], int]:
    if value_type not in GGUFReader.gguf_scalar_to_np:
        raise ValueError(f"GGUF metadata {key!r} has unsupported value type {value_type}")
    dtype = np.dtype(GGUFReader.gguf_scalar_to_np[value_type]).newbyteorder("<")
    end = pos + count * dtype.itemsize
    if end > len(buf):
        raise struct.error(f"{key} runs past the end of the file")
    return np.frombuffer(buf, dtype, count, pos).tolist(), end


def _read_tensor_table(
    buf: mmap.mmap, pos: int, num_tensors: int, alignment: int, path: Path
) -> dict[str, GGUFTensorInfo]:
    """Each entry: name, dimension count, `ne` dimensions, ggml type, offset of its data
    from the start of the data section (the table's end, rounded up to `alignment`)."""
    entries = []
    for _ in range(num_tensors):
        name, pos = _read_string(buf, pos)
        (num_dims,) = struct.unpack_from("<I", buf, pos)
        *shape, raw_type, offset = struct.unpack_from(f"<{num_dims}QIQ", buf, pos + 4)
        pos += 4 + 8 * num_dims + 12
        entries.append((name, tuple(shape), raw_type, offset))
    data_start = -(-pos // alignment) * alignment
    tensors: dict[str, GGUFTensorInfo] = {}
    for name, shape, raw_type, offset in entries:
        if name in tensors:
            raise ValueError(f"{path}: GGUF tensor {name} appears twice")
        tensors[name] = _tensor_info(name, shape, raw_type, path)
        if data_start + offset + _num_bytes(tensors[name]) > len(buf):
            raise ValueError(f"{path} is truncated: tensor {name} runs past the end of the file")
    return tensors


def _alignment(metadata: Mapping[str, Any], path: Path) -> int:
    alignment = metadata.get("general.alignment", _DEFAULT_ALIGNMENT)
    if type(alignment) is not int or alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"{path}: general.alignment {alignment!r} is not a power of two")
    return alignment


def _tensor_info(name: str, shape: tuple[int, ...], raw_type: int, path: Path) -> GGUFTensorInfo:
    try:
        tensor_type = GGMLQuantizationType(raw_type)
    except ValueError:
        raise ValueError(f"{path}: GGUF tensor {name} has unknown type {raw_type}") from None
    return GGUFTensorInfo(name, shape, tensor_type)


def _num_bytes(tensor: GGUFTensorInfo) -> int:
    block_size, type_size = GGML_QUANT_SIZES[tensor.tensor_type]
    return math.prod(tensor.shape) * type_size // block_size
