"""Token bitmasks on the wire and on the logits: bit j of word j // 32 allows token j."""

from __future__ import annotations

import struct

import pytest
import torch
import xgrammar

from core.structured_output.bitmask import pack_grammar_bitmask
from core.worker.contract import GrammarBitmask
from core.worker.grammar_bitmask import (
    allowed_token_mask,
    apply_grammar_bitmask,
    grammar_bitmask_tensor,
)


def _random_words(num_rows: int, width: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(-(2**31), 2**31, (num_rows, width), dtype=torch.int32, generator=generator)


def _bit(words: torch.Tensor, row: int, token_id: int) -> bool:
    """Token `token_id`'s bit, read the slow way: unsigned word, then shift."""
    word = int(words[row, token_id // 32]) & 0xFFFFFFFF
    return bool(word >> (token_id % 32) & 1)


def test_pack_writes_little_endian_int32_rows_and_unpacks_back():
    words = torch.tensor([[1, -1], [-(2**31), 0x12345678]], dtype=torch.int32)
    packed = pack_grammar_bitmask(["a", "b"], words)
    assert packed.req_ids == ["a", "b"] and packed.words_per_row == 2
    assert packed.data == struct.pack("<4i", 1, -1, -(2**31), 0x12345678)
    assert torch.equal(grammar_bitmask_tensor(packed), words)


def test_allowed_token_mask_reads_bit_j_of_word_j_div_32():
    words = torch.tensor([[0b101, -(2**31)], [0, -1]], dtype=torch.int32)
    allowed = allowed_token_mask(words, 64)
    assert allowed[0].nonzero().flatten().tolist() == [0, 2, 63]
    assert allowed[1].nonzero().flatten().tolist() == list(range(32, 64))


def test_allowed_token_mask_matches_each_bit():
    words = _random_words(3, 5)
    allowed = allowed_token_mask(words, 160)
    expected = [[_bit(words, r, j) for j in range(160)] for r in range(3)]
    assert allowed.tolist() == expected


def test_tokens_past_the_bitmask_are_not_allowed_and_extra_bits_are_ignored():
    words = torch.full((1, 2), -1, dtype=torch.int32)  # all 64 bits set
    assert allowed_token_mask(words, 70)[0].tolist() == [True] * 64 + [False] * 6
    assert allowed_token_mask(words, 40).shape == (1, 40)


def test_apply_sets_exactly_the_disallowed_tokens_of_named_rows_to_minus_inf():
    vocab_size = 100  # not a multiple of 32: the last word is partly padding
    logits = torch.randn(3, vocab_size, generator=torch.Generator().manual_seed(1))
    original = logits.clone()
    words = _random_words(3, 4, seed=2)
    # Rows for c and a in another order than the batch, and for a request not sampling here.
    bitmask = pack_grammar_bitmask(["c", "gone", "a"], words)
    apply_grammar_bitmask(logits, ["a", "b", "c"], bitmask)
    for batch_row, mask_row in [(0, 2), (2, 0)]:
        for token_id in range(vocab_size):
            if _bit(words, mask_row, token_id):
                assert logits[batch_row, token_id] == original[batch_row, token_id]
            else:
                assert logits[batch_row, token_id] == float("-inf")
    assert torch.equal(logits[1], original[1])


def test_apply_matches_xgrammar_reference():
    logits = torch.randn(4, 49152, generator=torch.Generator().manual_seed(3))
    words = _random_words(4, 1536, seed=4)
    expected = logits.clone()
    xgrammar.apply_token_bitmask_inplace(expected, words)
    apply_grammar_bitmask(
        logits, ["r0", "r1", "r2", "r3"], pack_grammar_bitmask(["r0", "r1", "r2", "r3"], words)
    )
    assert torch.equal(logits, expected)


def test_apply_without_matching_rows_changes_nothing():
    logits = torch.randn(2, 64)
    original = logits.clone()
    bitmask = pack_grammar_bitmask(["other"], torch.zeros((1, 2), dtype=torch.int32))
    apply_grammar_bitmask(logits, ["a", "b"], bitmask)
    assert torch.equal(logits, original)


@pytest.mark.parametrize(
    "bitmask",
    [
        GrammarBitmask(req_ids=["a"], words_per_row=2, data=b"\0" * 4),
        GrammarBitmask(req_ids=["a"], words_per_row=0, data=b""),
    ],
)
def test_malformed_bitmask_raises_value_error(bitmask):
    with pytest.raises(ValueError, match="grammar bitmask data"):
        grammar_bitmask_tensor(bitmask)


def test_pack_rejects_a_row_count_that_does_not_match_the_ids():
    with pytest.raises(ValueError, match="2 rows for 1 request ids"):
        pack_grammar_bitmask(["a"], torch.zeros((2, 3), dtype=torch.int32))


def test_apply_gives_a_request_verifying_drafts_its_rows_in_order():
    # Request "a" verifies two drafts (three positions); "b" samples once. Bitmask rows:
    # a's three, then b's; logits rows: b first, then a's three.
    vocab_size = 40
    rows = torch.zeros(4, 2, dtype=torch.int32)
    for row, token_id in enumerate([1, 2, 3, 4]):  # each row allows one token
        rows[row, token_id // 32] = 1 << token_id % 32
    bitmask = pack_grammar_bitmask(["a", "a", "a", "b"], rows)
    logits = torch.zeros(4, vocab_size)
    apply_grammar_bitmask(logits, ["b", "a", "a", "a"], bitmask)
    allowed = [(row > float("-inf")).nonzero().flatten().tolist() for row in logits]
    assert allowed == [[4], [1], [2], [3]]
