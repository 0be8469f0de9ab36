"""Integers packed into int32 words, in order from the least significant bits: how GPTQ
and compressed-tensors checkpoints store 4- and 8-bit values (AWQ interleaves its own
order: core_quant_awq.awq_format).

Along the packed dimension, word w holds values w * P .. w * P + P - 1 (P = 32 / bits),
value w * P + i in bits i * bits .. (i + 1) * bits - 1, unsigned.
"""

from __future__ import annotations

import torch

__all__ = ["pack_int32", "unpack_int32"]


def _shifts(bits: int, device: torch.device) -> torch.Tensor:
    if bits not in (2, 4, 8):
        raise ValueError(f"bits: values packed in int32 words are 2, 4 or 8 bits, got {bits}")
    return torch.arange(0, 32, bits, dtype=torch.int32, device=device)


def unpack_int32(packed: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """int32 words -> the unsigned values (int32), `dim` P times longer."""
    shifts = _shifts(bits, packed.device)
    moved = packed.movedim(dim, -1)
    values = (moved[..., None] >> shifts) & ((1 << bits) - 1)  # [..., words, P]
    return values.flatten(-2).movedim(-1, dim)


def pack_int32(values: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """Unsigned values (0 .. 2^bits - 1) -> int32 words along `dim` (its size a multiple of
    32 / bits); the inverse of `unpack_int32`."""
    shifts = _shifts(bits, values.device)
    moved = values.to(torch.int32).movedim(dim, -1)
    per_word = len(shifts)
    if moved.shape[-1] % per_word:
        raise ValueError(f"{moved.shape[-1]} values do not fill int32 words of {per_word}")
    grouped = moved.reshape(*moved.shape[:-1], -1, per_word)
    # Bits past 31 of a shifted value wrap into the sign: the sum is the word's bit pattern.
    words = (grouped.to(torch.int64) << shifts.to(torch.int64)).sum(dim=-1)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return words.movedim(-1, dim)
