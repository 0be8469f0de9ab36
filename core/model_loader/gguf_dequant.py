"""GGUF (ggml) tensor types to torch tensors: dequantized, or kept quantized.

Block layouts follow ggml's `ggml-common.h`; every scale is an IEEE half. Vectorized
torch is about twice as fast as `gguf.quants.dequantize` (numpy) on these machines and
gives bit-identical float32 results (same operation order), which the tests check.
`to_packed` converts the block types into core's group-quantized layout instead
(`core.quantization.packed`), exactly: the packed weight dequantizes to the same floats.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from core.ops.quant_linear import pack
from core.quantization.packed import PackedWeight

_FLOAT_TYPES: dict[GGMLQuantizationType, torch.dtype] = {
    GGMLQuantizationType.F32: torch.float32,
    GGMLQuantizationType.F16: torch.float16,
    GGMLQuantizationType.BF16: torch.bfloat16,
}


def dequantize(
    raw: np.ndarray, qtype: GGMLQuantizationType, shape: tuple[int, ...]
) -> torch.Tensor:
    """Decode the stored bytes `raw` of one GGUF tensor of type `qtype` into `shape`.

    `raw` is the tensor's data as `gguf.GGUFReader` exposes it (any dtype, C-contiguous);
    `shape` is in torch order (outermost first, the reverse of GGUF's `ne`). Float types
    come back in their own dtype so that a later cast rounds only once; block types come
    back as float32. The result owns its memory (it does not alias the memory map).
    Raises ValueError for a type with no decoder here.
    """
    data = torch.from_numpy(np.ascontiguousarray(raw).view(np.uint8).reshape(-1).copy())
    if qtype in _FLOAT_TYPES:
        return data.view(_FLOAT_TYPES[qtype]).reshape(shape)
    decode = _BLOCK_DECODERS.get(qtype)
    if decode is None:
        raise ValueError(f"cannot dequantize GGUF tensor type {qtype.name}")
    _, type_size = GGML_QUANT_SIZES[qtype]
    return decode(data.reshape(-1, type_size)).reshape(shape)


def _half(blocks: torch.Tensor, start: int) -> torch.Tensor:
    # blocks: [N, type_size] uint8 -> [N, 1] float32 from the half at byte `start`
    return blocks[:, start : start + 2].contiguous().view(torch.float16).float()


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    # packed: [..., G, L] uint8 -> [..., G, 2, L]: low nibbles first, then high nibbles
    return torch.stack((packed & 0x0F, packed >> 4), dim=-2)


def _q8_0(blocks: torch.Tensor) -> torch.Tensor:
    # block (34 B): d: f16, q[32]: int8; y = q * d
    return blocks[:, 2:].view(torch.int8).float() * _half(blocks, 0)


def _q4_0(blocks: torch.Tensor) -> torch.Tensor:
    # block (18 B): d: f16, qs[16]; y[i] = d * (low nibble of qs[i] - 8), y[i+16]: high nibble
    q = _nibbles(blocks[:, 2:]).reshape(-1, 32).float() - 8
    return _half(blocks, 0) * q


def _q4_1(blocks: torch.Tensor) -> torch.Tensor:
    # block (20 B): d: f16, m: f16, qs[16]; y = d * nibble + m, nibbles ordered as in Q4_0
    q = _nibbles(blocks[:, 4:]).reshape(-1, 32).float()
    return _half(blocks, 0) * q + _half(blocks, 2)


def _k_scales_mins(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unpack the 12-byte scale field of Q4_K / Q5_K into 8 six-bit scales and 8 mins.

    Bytes 0-3 hold scales 0-3 in their low 6 bits, bytes 4-7 mins 0-3; for j = 4..7 the
    low 4 bits come from byte 8+(j-4) (scale: low nibble, min: high nibble) and the top
    2 bits from the spare high bits of bytes j-4 (scale) and j (min).
    """
    low_scales, low_mins, high = packed.reshape(-1, 3, 4).unbind(dim=1)  # each [N, 4]
    scales = torch.cat((low_scales & 0x3F, (high & 0x0F) | ((low_scales >> 2) & 0x30)), dim=1)
    mins = torch.cat((low_mins & 0x3F, (high >> 4) | ((low_mins >> 2) & 0x30)), dim=1)
    return scales.float(), mins.float()  # [N, 8] each


def _k_affine(blocks: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    # Q4_K / Q5_K: sub-block s of 32 values: y = (d * scale[s]) * q - dmin * min[s]
    scales, mins = _k_scales_mins(blocks[:, 4:16])
    step = (_half(blocks, 0) * scales).unsqueeze(-1)  # [N, 8, 1]
    offset = (_half(blocks, 2) * mins).unsqueeze(-1)  # [N, 8, 1]
    return (step * q.float() - offset).reshape(-1, 256)


def _q4_k(blocks: torch.Tensor) -> torch.Tensor:
    # block (144 B): d, dmin: f16, scales[12], qs[128]; 64-value chunk c reads qs[32c:32c+32]:
    # low nibbles are sub-block 2c, high nibbles sub-block 2c+1
    q = _nibbles(blocks[:, 16:].reshape(-1, 4, 32)).reshape(-1, 8, 32)
    return _k_affine(blocks, q)


def _q5_k(blocks: torch.Tensor) -> torch.Tensor:
    # block (176 B): d, dmin: f16, scales[12], qh[32], qs[128]; as Q4_K, plus a fifth bit:
    # bit s of qh[l] is bit 4 of value l of sub-block s
    low = _nibbles(blocks[:, 48:].reshape(-1, 4, 32)).reshape(-1, 8, 32)
    shifts = torch.arange(8, dtype=torch.uint8).reshape(1, 8, 1)
    high = (blocks[:, 16:48].unsqueeze(1) >> shifts) & 1  # [N, 8, 32]
    return _k_affine(blocks, low | (high << 4))


def _q6_k(blocks: torch.Tensor) -> torch.Tensor:
    # block (210 B): ql[128], qh[64], scales[16]: int8, d: f16. Each 128-value half h reads
    # ql[64h:64h+64] (low nibbles of its two 32-byte rows, then high nibbles) and
    # qh[32h:32h+32] (2-bit pairs at shifts 0, 2, 4, 6, one per 32 values);
    # y = d * scale[i // 16] * (6-bit value - 32)
    low = _nibbles(blocks[:, :128].reshape(-1, 2, 64)).reshape(-1, 8, 32)
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).reshape(1, 1, 4, 1)
    high = ((blocks[:, 128:192].reshape(-1, 2, 1, 32) >> shifts) & 3).reshape(-1, 8, 32)
    q = (low | (high << 4)).float() - 32
    step = (_half(blocks, 208) * blocks[:, 192:208].view(torch.int8).float()).unsqueeze(-1)
    return (step * q.reshape(-1, 16, 16)).reshape(-1, 256)  # step: [N, 16, 1]


_BLOCK_DECODERS: dict[GGMLQuantizationType, Callable[[torch.Tensor], torch.Tensor]] = {
    GGMLQuantizationType.Q8_0: _q8_0,
    GGMLQuantizationType.Q4_0: _q4_0,
    GGMLQuantizationType.Q4_1: _q4_1,
    GGMLQuantizationType.Q4_K: _q4_k,
    GGMLQuantizationType.Q5_K: _q5_k,
    GGMLQuantizationType.Q6_K: _q6_k,
}

SUPPORTED_TYPES: frozenset[GGMLQuantizationType] = frozenset(_FLOAT_TYPES) | frozenset(
    _BLOCK_DECODERS
)


def to_packed(raw: torch.Tensor, qtype: GGMLQuantizationType, cols: int) -> PackedWeight:
    """The block-quantized rows `raw` (uint8 [rows, bytes per row]) of a matrix with
    `cols` columns as a PackedWeight: Q4_0, Q4_1 and Q4_K keep 4 bits a value, Q5_K,
    Q6_K and Q8_0 become 8-bit values. ValueError for a type with no conversion here
    or bytes that do not fit `cols`."""
    convert = _PACKERS.get(qtype)
    if convert is None:
        raise ValueError(f"GGUF tensor type {qtype.name} cannot be kept quantized")
    block_values, type_size = GGML_QUANT_SIZES[qtype]
    rows = raw.shape[0]
    if cols % block_values or raw.shape[1] != cols // block_values * type_size:
        raise ValueError(f"{raw.shape[1]} bytes a row do not hold {cols} {qtype.name} values")
    qweight, scales, mins, bits = convert(raw.reshape(-1, type_size))
    return PackedWeight(
        qweight.reshape(rows, -1), scales.reshape(rows, -1), mins.reshape(rows, -1), bits
    )


PackedParts = tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]
"""(qweight, scales, mins, bits) per block, before the rows are restored."""


def _pack_q8_0(blocks: torch.Tensor) -> PackedParts:
    d = _half(blocks, 0)
    return blocks[:, 2:].view(torch.int8), d, torch.zeros_like(d), 8


def _pack_q4_0(blocks: torch.Tensor) -> PackedParts:
    # ggml's nibble order inside a block is the packed layout's: the bytes stay as they are
    d = _half(blocks, 0)
    return blocks[:, 2:], d, -8 * d, 4


def _pack_q4_1(blocks: torch.Tensor) -> PackedParts:
    return blocks[:, 4:], _half(blocks, 0), _half(blocks, 2), 4


def _k_steps(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # Q4_K / Q5_K: per sub-block of 32, the step d * scale and the offset -dmin * min
    scales, mins = _k_scales_mins(blocks[:, 4:16])
    return _half(blocks, 0) * scales, -(_half(blocks, 2) * mins)


def _pack_q4_k(blocks: torch.Tensor) -> PackedParts:
    q = _nibbles(blocks[:, 16:].reshape(-1, 4, 32)).reshape(-1, 256)
    return pack(q, 4), *_k_steps(blocks), 4


def _pack_q5_k(blocks: torch.Tensor) -> PackedParts:
    low = _nibbles(blocks[:, 48:].reshape(-1, 4, 32)).reshape(-1, 8, 32)
    shifts = torch.arange(8, dtype=torch.uint8).reshape(1, 8, 1)
    high = (blocks[:, 16:48].unsqueeze(1) >> shifts) & 1
    q = (low | (high << 4)).reshape(-1, 256)
    return pack(q, 8), *_k_steps(blocks), 8


def _pack_q6_k(blocks: torch.Tensor) -> PackedParts:
    low = _nibbles(blocks[:, :128].reshape(-1, 2, 64)).reshape(-1, 8, 32)
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).reshape(1, 1, 4, 1)
    high = ((blocks[:, 128:192].reshape(-1, 2, 1, 32) >> shifts) & 3).reshape(-1, 8, 32)
    q = (low | (high << 4)).to(torch.int16).reshape(-1, 256) - 32
    step = _half(blocks, 208) * blocks[:, 192:208].view(torch.int8).float()  # [N, 16]
    return pack(q, 8), step, torch.zeros_like(step), 8


_PACKERS: dict[GGMLQuantizationType, Callable[[torch.Tensor], PackedParts]] = {
    GGMLQuantizationType.Q8_0: _pack_q8_0,
    GGMLQuantizationType.Q4_0: _pack_q4_0,
    GGMLQuantizationType.Q4_1: _pack_q4_1,
    GGMLQuantizationType.Q4_K: _pack_q4_k,
    GGMLQuantizationType.Q5_K: _pack_q5_k,
    GGMLQuantizationType.Q6_K: _pack_q6_k,
}

PACKED_TYPES: frozenset[GGMLQuantizationType] = frozenset(_PACKERS)
FLOAT_TYPES: dict[GGMLQuantizationType, torch.dtype] = dict(_FLOAT_TYPES)
# The byte offsets of each block's half-precision scales: the fields random bytes could
# turn into infinities or NaNs.
_HALF_FIELDS: dict[GGMLQuantizationType, tuple[int, ...]] = {
    GGMLQuantizationType.Q8_0: (0,),
    GGMLQuantizationType.Q4_0: (0,),
    GGMLQuantizationType.Q4_1: (0, 2),
    GGMLQuantizationType.Q4_K: (0, 2),
    GGMLQuantizationType.Q5_K: (0, 2),
    GGMLQuantizationType.Q6_K: (208,),
}


def random_blocks(
    qtype: GGMLQuantizationType, rows: int, cols: int, generator: torch.Generator
) -> torch.Tensor:
    """Random valid stored bytes (uint8 [rows, bytes per row]) of a `qtype` matrix: any
    values, finite small scales. For tests and the conformance kit."""
    block_values, type_size = GGML_QUANT_SIZES[qtype]
    if qtype in _FLOAT_TYPES:
        values = torch.randn(rows, cols, generator=generator) * 0.1
        return values.to(_FLOAT_TYPES[qtype]).view(torch.uint8)
    blocks = torch.randint(0, 256, (rows * cols // block_values, type_size), generator=generator)
    blocks = blocks.to(torch.uint8)
    for start in _HALF_FIELDS[qtype]:
        halves = (torch.rand(blocks.shape[0], generator=generator) * 0.01).half()
        blocks[:, start : start + 2] = halves.view(torch.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)
