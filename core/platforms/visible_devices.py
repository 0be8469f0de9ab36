"""Device-selection environment variables (CUDA_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES...),
read the way the device runtimes read them, without loading one.

Platform probes use this to say "unavailable" when the variable hides every device, so
that a GPU host started with CUDA_VISIBLE_DEVICES="" runs on the CPU and says why. Kept
free of torch: probes must stay cheap (DESIGN.md section 3).
"""

from __future__ import annotations

import os

from core.platforms.unavailable import Unavailable

__all__ = ["check_visible_devices", "num_visible_devices"]


def num_visible_devices(value: str, num_devices: int) -> int:
    """How many of a host's `num_devices` devices a selection variable set to `value`
    leaves visible.

    As the CUDA and HIP runtimes read it: a comma list, read up to its first entry that
    names no device ("-1", an index past the last device, anything empty); "" hides every
    device. Entries that are not indices (GPU-/MIG- UUIDs) cannot be checked without the
    driver's management library, so they count as devices.
    """
    count = 0
    for entry in (e.strip() for e in value.split(",")):
        if not _names_a_device(entry, num_devices):
            break
        count += 1
    return count


def check_visible_devices(env_var: str, num_devices: int, kind: str) -> None:
    """Raise Unavailable, naming `env_var` and its value, when it is set and leaves none of
    the host's `num_devices` devices (of `kind`, e.g. "NVIDIA GPU") visible."""
    value = os.environ.get(env_var)
    if value is None or num_visible_devices(value, num_devices) > 0:
        return
    if not value.strip():
        raise Unavailable(f"{env_var} is set to {value!r}, which hides every {kind}")
    ids = "id 0" if num_devices == 1 else f"ids 0-{num_devices - 1}"
    raise Unavailable(
        f"{env_var}={value!r} names no {kind}: this host has {num_devices} ({ids}), "
        "and the list ends at its first entry that is not one"
    )


def _names_a_device(entry: str, num_devices: int) -> bool:
    if not entry:
        return False
    try:
        index = int(entry)
    except ValueError:
        return True  # a UUID: only the driver's library can say whether it exists
    return 0 <= index < num_devices
