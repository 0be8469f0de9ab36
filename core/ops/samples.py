"""What each kernel op carries for conformance checks: sample inputs and per-dtype tolerances.

Every kernel op declared through `OpRegistry.declare` carries a `Conformance`: a sample
builder and a tolerance per dtype. The conformance kit (`--core-conformance=kernels:NAME`)
runs each kernel a plugin registers over the samples of each such dtype and compares it
with the op's reference. Samples are the edges a kernel gets wrong: one row, odd sizes,
strided views where the op takes them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Tolerance:
    """How far a kernel's tensors may be from the reference's, elementwise:
    |got - want| <= atol + rtol * |want| (torch.testing.assert_close's rule)."""

    rtol: float
    atol: float


@dataclass(frozen=True)
class OpSample:
    """One call of an op: what edge it exercises (for failure messages) and its arguments."""

    name: str
    args: tuple[Any, ...]


SampleBuilder = Callable[[torch.dtype, torch.device], Sequence[OpSample]]
"""(dtype, device) -> the samples of an op in that dtype, built on that device.

A builder makes fresh tensors on every call, with the same values every time (seeded
generators): the kit calls it once for the kernel and once for the reference, so an op
that writes into its arguments starts both runs from equal tensors. Strided samples are
views built on the device itself (moving a view to a device copies it contiguous).
"""


@dataclass(frozen=True)
class Conformance:
    """An op's conformance inputs and, per dtype the kit checks, how close a kernel must
    come to the reference on them. ValueError when `tolerances` names no dtype."""

    samples: SampleBuilder
    tolerances: Mapping[torch.dtype, Tolerance]

    def __post_init__(self) -> None:
        if not self.tolerances:
            raise ValueError("tolerances: name at least one dtype to check")


def randn(
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: torch.device,
    seed: int,
    scale: float = 1.0,
) -> torch.Tensor:
    """Seeded standard-normal values times `scale`, drawn in float32 on the CPU (the same
    values on every device), rounded to `dtype`."""
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=generator) * scale).to(device=device, dtype=dtype)
