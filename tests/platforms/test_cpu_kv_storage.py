"""The CPU platform's KV cache storage: zeros that cost no memory until written."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from core.platforms.cpu import CpuPlatform

MIB = 1 << 20


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_the_storage_is_zeros_the_caller_can_write():
    buffer = CpuPlatform().zeroed_bytes(3 * MIB + 5, torch.device("cpu"))
    assert buffer.dtype == torch.int8 and buffer.shape == (3 * MIB + 5,)
    assert not buffer.any()
    view = buffer[:64].view(torch.bfloat16)  # the layers view it in their dtypes
    view.fill_(1.5)
    assert view.eq(1.5).all() and not buffer[64:].any()


def test_an_empty_storage_is_an_empty_tensor():
    assert CpuPlatform().zeroed_bytes(0, torch.device("cpu")).numel() == 0


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/statm")
def test_untouched_pages_take_no_memory():
    # torch.zeros wrote every page (a 4 GiB cache took seconds at start); untouched pages
    # of a zero mapping are not resident.
    before = _resident_bytes()
    buffer = CpuPlatform().zeroed_bytes(512 * MIB, torch.device("cpu"))
    grown = _resident_bytes() - before
    buffer[: 4 * MIB].fill_(1)
    assert grown < 64 * MIB
    assert _resident_bytes() - before >= 4 * MIB
