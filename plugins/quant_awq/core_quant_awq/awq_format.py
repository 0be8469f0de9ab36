"""AutoAWQ's GEMM checkpoint layout: packing, unpacking and the dense reference.

A linear layer W [out, in] quantized to 4 bits in groups of G inputs is stored as
- `qweight` int32 [in, out / 8]: row k holds q[:, k]; int32 column c packs outputs
  8c .. 8c + 7, output 8c + ORDER[i] in bits 4i .. 4i + 3 (AutoAWQ's interleaved order);
- `qzeros` int32 [in / G, out / 8]: the zero points z, packed the same way;
- `scales` half [in / G, out];
and W[o, k] = (q[o, k] - z[o, k // G]) * scales[k // G, o].
"""

from __future__ import annotations

import torch

BITS = 4
PACK = 32 // BITS  # values per int32
ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
"""Output 8c + ORDER[i] sits in nibble i of int32 column c."""
_SHIFTS = torch.tensor([4 * ORDER.index(j) for j in range(PACK)], dtype=torch.int32)
"""_SHIFTS[j]: the bit offset of output 8c + j in its int32."""


def pack_columns(values: torch.Tensor) -> torch.Tensor:
    """[rows, out] integers 0..15 -> int32 [rows, out / 8] in AutoAWQ's order."""
    rows, out = values.shape
    if out % PACK:
        raise ValueError(f"output size {out} is not a multiple of {PACK}")
    grouped = values.to(torch.int32).reshape(rows, out // PACK, PACK)
    return (grouped << _SHIFTS.to(values.device)).sum(dim=-1, dtype=torch.int32)


def unpack_columns(packed: torch.Tensor) -> torch.Tensor:
    """int32 [rows, out / 8] -> the values [rows, out] as uint8 (inverse of `pack_columns`)."""
    rows = packed.shape[0]
    values = (packed[..., None] >> _SHIFTS.to(packed.device)) & 0xF  # [rows, out / 8, 8]
    return values.reshape(rows, -1).to(torch.uint8)


def dequantize(
    qweight: torch.Tensor,  # int32 [in, out / 8]
    qzeros: torch.Tensor,  # int32 [in / G, out / 8]
    scales: torch.Tensor,  # [in / G, out]
) -> torch.Tensor:  # [out, in] float32
    """W [out, in] in float32, exactly (q - z) * scale."""
    q = unpack_columns(qweight).float()  # [in, out]
    z = unpack_columns(qzeros).float()  # [in / G, out]
    group = q.shape[0] // z.shape[0]
    z = z.repeat_interleave(group, dim=0)
    s = scales.float().repeat_interleave(group, dim=0)
    return ((q - z) * s).T.contiguous()
