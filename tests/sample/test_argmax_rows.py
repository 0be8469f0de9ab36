"""argmax_rows against torch's argmax: ties to the lowest index, NaNs, rows shorter than a
block, a tail past the last whole block, and the maximum in each place."""

from __future__ import annotations

import pytest
import torch

from core.sample.sampler import argmax_rows


def _rows(width: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(width)
    x = torch.randn(8, width, generator=gen)
    last = width - 1
    x[0, last] = 9.0  # the maximum at the very end (in a tail where there is one)
    x[1, 0] = 9.0  # at the very start
    x[2, [last, width // 2, 0]] = 7.0  # three-way tie: the lowest index wins
    x[3] = 1.5  # all equal
    x[4] = float("-inf")  # all banned
    x[5, width // 2] = float("nan")  # a NaN is torch's argmax
    x[6, [last, 0]] = float("nan")  # two: the first
    x[7, last] = float("inf")
    return x


@pytest.mark.parametrize("width", [1, 200, 256, 257, 511, 1000, 4096, 49153])
def test_argmax_rows_equals_torch_argmax(width):
    x = _rows(width)
    assert argmax_rows(x).tolist() == x.argmax(dim=-1).tolist()


def test_a_row_of_a_real_vocabulary_picks_its_lowest_tied_index_in_a_later_block():
    x = torch.zeros(2, 49152)
    x[0, [300, 40000]] = 3.0
    x[1, 48000] = 1.0
    assert argmax_rows(x).tolist() == [300, 48000]
