"""float32 linear layers through oneDNN with each weight reordered once into its blocked layout.

For a decode batch (17-128 rows) torch's BLAS (MKL) is slow on a small model's shapes;
oneDNN's matmul on a pre-packed weight measured, with 2 threads on an AMD EPYC (AVX2),
0.76-0.92x MKL's time on SmolLM2's decoder linears at 32-64 rows and 0.56-0.77x on its
49,152-row head at 32-128 rows (about 1.0x at 128 rows with the weights hot in cache, but
in the model, each weight cold from memory, a 128-token prefill's linears took 187 ms
against MKL's 197 ms); larger chunks stay on torch. The packed copy sits beside the
layer's weight, which the GEMV and everything else keep reading: weight memory grows by up
to `max_packed_bytes()`, after which weights go unpacked (torch).

A pack is keyed by the weight tensor itself and remade when the tensor is written in place
(its version counter moves), so loading or editing weights never leaves a stale copy.
"""

from __future__ import annotations

import functools
import os
import weakref
from dataclasses import dataclass

import torch

MAX_ROWS = 128
# Share of the machine's memory the packed copies may take: small models (a few hundred
# MB of float32 weights on a machine of tens of GB) get every layer packed; a model whose
# weights alone would not fit twice stays on torch.
MEMORY_SHARE = 1 / 8


@dataclass
class _Pack:
    weight: weakref.ref
    version: int
    packed: torch.Tensor


_packs: dict[int, _Pack] = {}
_packed_bytes = 0


@functools.cache
def available() -> bool:
    """Whether this torch has oneDNN (mkldnn) and its linear ops."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


@functools.cache
def max_packed_bytes() -> int:
    return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") * MEMORY_SHARE)


def packed_weight(weight: torch.Tensor) -> torch.Tensor | None:
    """`weight`'s oneDNN-packed copy (made now if missing or stale), or None when the
    budget is spent."""
    global _packed_bytes
    key = id(weight)
    pack = _packs.get(key)
    if pack is not None and pack.weight() is weight and pack.version == weight._version:
        return pack.packed
    if pack is not None:  # stale: the same tensor written since, or a new one at its id
        _drop(key)
    size = weight.numel() * weight.element_size()
    if _packed_bytes + size > max_packed_bytes():
        return None
    with torch.inference_mode():
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
    _packs[key] = _Pack(weakref.ref(weight, lambda _: _drop(key)), weight._version, packed)
    _packed_bytes += size
    return packed


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ W^T + bias with W's packed copy."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def _drop(key: int) -> None:
    global _packed_bytes
    pack = _packs.pop(key, None)
    if pack is not None:
        _packed_bytes -= pack.packed.numel() * pack.packed.element_size()
