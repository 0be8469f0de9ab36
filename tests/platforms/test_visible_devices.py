"""Reading CUDA_VISIBLE_DEVICES-style lists as the runtimes do: up to the first entry that
names no device."""

from __future__ import annotations

import pytest

from core.platforms.visible_devices import num_visible_devices


@pytest.mark.parametrize(
    ("value", "visible"),
    [
        ("", 0),
        ("-1", 0),
        ("0", 1),
        ("2,1", 2),
        ("0,2,-1,1", 2),  # CUDA's documented example: 1 stays hidden
        ("1,3", 1),  # 3 is past the last of 3 devices
        (" 0 , 1 ", 2),
        ("0,,1", 1),
        ("GPU-8f6c3a2e,MIG-1b2c", 2),  # UUIDs: not checkable without the driver's library
    ],
)
def test_visible_devices_end_at_the_first_entry_that_is_not_a_device(value, visible):
    assert num_visible_devices(value, num_devices=3) == visible
