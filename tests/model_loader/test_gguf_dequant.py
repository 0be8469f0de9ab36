"""Dequantization of each supported GGUF type, read back from real GGUF files.

Types gguf-py can quantize round-trip random data through a file and are checked against
gguf's own dequantizer and against the original values. The K-quants (which gguf-py cannot
quantize) are packed by hand here from ggml's documented block layout, and the decoded
values are checked against the formula of that layout.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from tiny_checkpoints import tiny_model, write_gguf_model

from core.model_loader import load_gguf_checkpoint
from core.model_loader.gguf_dequant import dequantize

_SHAPE = (8, 512)  # 8 rows of 512: 16 blocks of 32 or 2 super-blocks of 256 per row


def _write_and_read(tmp_path: Path, data: np.ndarray, qtype: T) -> gguf.ReaderTensor:
    path = tmp_path / f"{qtype.name}.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("x.weight", data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    (tensor,) = gguf.GGUFReader(path).tensors
    return tensor


def _decode(tensor: gguf.ReaderTensor) -> torch.Tensor:
    return dequantize(tensor.data, tensor.tensor_type, _SHAPE)


@pytest.fixture
def original() -> np.ndarray:
    return np.random.default_rng(0).standard_normal(_SHAPE).astype(np.float32)


@pytest.mark.parametrize("qtype", [T.F32, T.F16, T.BF16])
def test_float_types_decode_to_the_rounded_original(tmp_path, original, qtype):
    stored = original if qtype == T.F32 else gguf.quants.quantize(original, qtype)
    decoded = _decode(_write_and_read(tmp_path, stored, qtype))
    dtype = {T.F32: torch.float32, T.F16: torch.float16, T.BF16: torch.bfloat16}[qtype]
    assert decoded.dtype == dtype
    assert torch.equal(decoded, torch.from_numpy(original).to(dtype))


def _amax(blocks: np.ndarray) -> np.ndarray:
    return np.abs(blocks).max(axis=1, keepdims=True)


# (type, largest error of a block of 32: half a step, or a whole one where ggml clips)
_BLOCK_TYPES = [
    (T.Q8_0, lambda blocks: _amax(blocks) / 127 / 2),
    (T.Q4_0, lambda blocks: _amax(blocks) / 8),
    (T.Q4_1, lambda blocks: np.ptp(blocks, axis=1, keepdims=True) / 15 / 2),
]


@pytest.mark.parametrize(("qtype", "max_error"), _BLOCK_TYPES)
def test_block_types_match_gguf_and_the_original(tmp_path, original, qtype, max_error):
    tensor = _write_and_read(tmp_path, gguf.quants.quantize(original, qtype), qtype)
    decoded = _decode(tensor)
    assert torch.equal(decoded, torch.from_numpy(gguf.quants.dequantize(tensor.data, qtype)))
    blocks = original.reshape(-1, 32)
    error = np.abs(decoded.numpy().reshape(-1, 32) - blocks)
    # plus the half-precision rounding of the block's scale and offset
    assert (error <= max_error(blocks) * 1.01 + 1e-3 * _amax(blocks)).all()


def _halves(values: np.ndarray) -> np.ndarray:
    # [N] -> [N, 2] bytes of IEEE halves
    return values.astype(np.float16).view(np.uint8).reshape(-1, 2)


def _pack_k_scales(scales: np.ndarray, mins: np.ndarray) -> np.ndarray:
    """ggml's get_scale_min_k4 layout: [N, 8] six-bit scales and mins -> [N, 12] bytes."""
    packed = np.zeros((len(scales), 12), dtype=np.uint8)
    for j in range(4):
        packed[:, j] = (scales[:, j] & 63) | ((scales[:, j + 4] >> 4) << 6)
        packed[:, j + 4] = (mins[:, j] & 63) | ((mins[:, j + 4] >> 4) << 6)
        packed[:, j + 8] = (scales[:, j + 4] & 15) | ((mins[:, j + 4] & 15) << 4)
    return packed


def _pack_nibble_chunks(q: np.ndarray) -> np.ndarray:
    """[N, 256] 4-bit values -> [N, 128]: byte 32c+l = q[64c+l] | q[64c+32+l] << 4."""
    out = np.zeros((len(q), 128), dtype=np.uint8)
    for c in range(4):
        out[:, 32 * c : 32 * c + 32] = (q[:, 64 * c : 64 * c + 32] & 15) | (
            (q[:, 64 * c + 32 : 64 * c + 64] & 15) << 4
        )
    return out


def _k_affine_expected(d, dmin, scales, mins, q) -> np.ndarray:
    # y[i] = d * scale[i // 32] * q[i] - dmin * min[i // 32]
    sub = np.arange(256) // 32
    return d[:, None] * scales[:, sub] * q - dmin[:, None] * mins[:, sub]


def _q4_k_blocks(rng, n):
    d, dmin = rng.uniform(0.01, 0.1, n), rng.uniform(0.01, 0.1, n)
    scales, mins = rng.integers(0, 64, (n, 8)), rng.integers(0, 64, (n, 8))
    q = rng.integers(0, 16, (n, 256))
    raw = np.concatenate(
        [_halves(d), _halves(dmin), _pack_k_scales(scales, mins), _pack_nibble_chunks(q)], axis=1
    )
    return raw, _k_affine_expected(_f16(d), _f16(dmin), scales, mins, q)


def _q5_k_blocks(rng, n):
    d, dmin = rng.uniform(0.01, 0.1, n), rng.uniform(0.01, 0.1, n)
    scales, mins = rng.integers(0, 64, (n, 8)), rng.integers(0, 64, (n, 8))
    q = rng.integers(0, 32, (n, 256))
    high = np.zeros((n, 32), dtype=np.uint8)  # bit s of qh[l]: bit 4 of value l of sub-block s
    for s in range(8):
        high |= ((q[:, 32 * s : 32 * s + 32] >> 4) << s).astype(np.uint8)
    raw = np.concatenate(
        [_halves(d), _halves(dmin), _pack_k_scales(scales, mins), high, _pack_nibble_chunks(q)],
        axis=1,
    )
    return raw, _k_affine_expected(_f16(d), _f16(dmin), scales, mins, q)


def _q6_k_blocks(rng, n):
    d = rng.uniform(0.001, 0.01, n)
    scales = rng.integers(-128, 128, (n, 16))
    q = rng.integers(0, 64, (n, 256))
    ql, qh = np.zeros((n, 128), dtype=np.uint8), np.zeros((n, 64), dtype=np.uint8)
    for h in range(2):  # each half of 128 values: rows r = 0..3 of 32
        rows = [q[:, 128 * h + 32 * r : 128 * h + 32 * r + 32] for r in range(4)]
        ql[:, 64 * h : 64 * h + 32] = (rows[0] & 15) | ((rows[2] & 15) << 4)
        ql[:, 64 * h + 32 : 64 * h + 64] = (rows[1] & 15) | ((rows[3] & 15) << 4)
        qh[:, 32 * h : 32 * h + 32] = sum((rows[r] >> 4) << (2 * r) for r in range(4))
    raw = np.concatenate([ql, qh, scales.astype(np.int8).view(np.uint8), _halves(d)], axis=1)
    # y[i] = d * scale[i // 16] * (q[i] - 32)
    return raw, _f16(d)[:, None] * scales[:, np.arange(256) // 16] * (q - 32)


def _f16(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).astype(np.float64)


@pytest.mark.parametrize(
    ("qtype", "make_blocks"),
    [(T.Q4_K, _q4_k_blocks), (T.Q5_K, _q5_k_blocks), (T.Q6_K, _q6_k_blocks)],
)
def test_k_quants_decode_hand_packed_blocks_to_the_layout_formula(tmp_path, qtype, make_blocks):
    num_blocks = _SHAPE[0] * _SHAPE[1] // 256
    raw, expected = make_blocks(np.random.default_rng(1), num_blocks)
    tensor = _write_and_read(tmp_path, raw.reshape(_SHAPE[0], -1), qtype)
    decoded = _decode(tensor)
    torch.testing.assert_close(
        decoded.double(), torch.from_numpy(expected).reshape(_SHAPE), rtol=1e-6, atol=1e-6
    )
    assert torch.equal(decoded, torch.from_numpy(gguf.quants.dequantize(tensor.data, qtype)))


def test_q4_k_known_block_decodes_to_hand_computed_values():
    # d = 0.5, dmin = 0.25; sub-block 1 has scale 3, min 2; sub-block 5 has scale 40, min 17
    scales = np.array([[1, 3, 0, 0, 0, 40, 0, 0]])
    mins = np.array([[0, 2, 0, 0, 0, 17, 0, 0]])
    q = np.zeros((1, 256), dtype=np.int64)
    q[0, 32] = 7  # sub-block 1 (high nibbles of chunk 0), element 0
    q[0, 32 * 5 + 3] = 15  # sub-block 5 (high nibbles of chunk 2), element 3
    raw = np.concatenate(
        [_halves(np.array([0.5])), _halves(np.array([0.25])), _pack_k_scales(scales, mins)]
        + [_pack_nibble_chunks(q)],
        axis=1,
    )
    decoded = dequantize(raw, T.Q4_K, (256,))
    assert decoded[32].item() == 0.5 * 3 * 7 - 0.25 * 2  # 10.0
    assert decoded[33].item() == -0.25 * 2  # q = 0
    assert decoded[32 * 5 + 3].item() == 0.5 * 40 * 15 - 0.25 * 17  # 295.75
    assert decoded[0].item() == 0.0  # scale 1, q 0, min 0


def test_unsupported_tensor_type_is_a_value_error_naming_type_and_tensor(tmp_path):
    path = write_gguf_model(
        tmp_path / "q5.gguf", tiny_model("llama"), tensor_types={"blk.1.ffn_up.weight": T.Q5_0}
    )
    with pytest.raises(ValueError, match=r"blk\.1\.ffn_up\.weight has type Q5_0"):
        load_gguf_checkpoint(path)


def test_dequantize_rejects_a_type_it_has_no_decoder_for():
    raw = gguf.quants.quantize(np.ones((1, 32), dtype=np.float32), T.Q5_0)
    with pytest.raises(ValueError, match="Q5_0"):
        dequantize(raw, T.Q5_0, (1, 32))


def test_quantized_model_file_loads_every_tensor_close_to_the_original(tmp_path):
    model = tiny_model("llama", hidden_size=128, intermediate_size=256)
    types = {
        "token_embd.weight": T.Q8_0,
        "blk.0.attn_q.weight": T.Q4_0,
        "blk.1.ffn_down.weight": T.Q4_1,
    }
    checkpoint = load_gguf_checkpoint(write_gguf_model(tmp_path / "q.gguf", model, types))
    weights = dict(checkpoint.iter_weights(torch.float32))
    state = model.state_dict()
    for name, step in (
        ("model.embed_tokens.weight", 1 / 127),
        ("model.layers.0.self_attn.q_proj.weight", 1 / 8),
        ("model.layers.1.mlp.down_proj.weight", 2 / 15),
    ):
        error = (weights[name] - state[name]).abs().max().item()
        assert 0 < error <= step * state[name].abs().max().item(), name
