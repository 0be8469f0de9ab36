"""int32 packing as GPTQ and compressed-tensors checkpoints store it, against a loop that
writes each value's bits where the formats' description puts them."""

from __future__ import annotations

import pytest
import torch

from core.quantization.int32_packing import pack_int32, unpack_int32


def packed_by_loop(values: list[int], bits: int) -> list[int]:
    """Word w holds value w * P + i in bits i * bits (P = 32 / bits), as signed int32."""
    per_word = 32 // bits
    words = []
    for w in range(len(values) // per_word):
        word = 0
        for i in range(per_word):
            word |= values[w * per_word + i] << (i * bits)
        words.append(word - 2**32 if word >= 2**31 else word)
    return words


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("dim", [0, 1])
def test_pack_and_unpack_follow_the_published_bit_order(bits, dim):
    torch.manual_seed(bits)
    per_word = 32 // bits
    shape = (3 * per_word, 5) if dim == 0 else (5, 3 * per_word)
    values = torch.randint(0, 2**bits, shape)
    packed = pack_int32(values, bits, dim)
    lines = values.T if dim == 0 else values
    expected = torch.tensor([packed_by_loop(line.tolist(), bits) for line in lines])
    assert torch.equal(packed.T if dim == 0 else packed, expected.to(torch.int32))
    assert torch.equal(unpack_int32(packed, bits, dim), values.to(torch.int32))


def test_bits_other_than_2_4_8_are_refused():
    with pytest.raises(ValueError, match="bits: .* got 3"):
        unpack_int32(torch.zeros(2, 2, dtype=torch.int32), 3, 0)
