"""Copies of weights in a kernel's own layout, made once and kept within one memory budget.

Some kernels multiply faster from a weight laid out for them (oneDNN's blocked layout for
a float32 decode batch, packed_linear.py; a quantized weight dequantized to bf16 strips,
ops.quant_linear). Such a copy sits beside the layer's weight, which everything else keeps
reading, so every copy of this process draws on one budget, `max_bytes()`; past it the
kernels multiply the weight as it is.

A copy is keyed by the tensors it was made from and remade when one of them is written in
place (its version counter moves), so loading or editing weights never leaves a stale copy;
it goes when its first source tensor is freed. Inference tensors have no version counter:
they get no copy.
"""

from __future__ import annotations

import functools
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch

# Share of the machine's memory the copies may take: small models (a few hundred MB of
# weights on a machine of tens of GB) get every layer copied; a model whose weights alone
# would not fit twice stays mostly on its own layout.
MEMORY_SHARE = 1 / 8


@dataclass
class _Copy:
    sources: tuple[weakref.ref, ...]
    versions: tuple[int, ...]
    copy: torch.Tensor


_copies: dict[tuple[str, int], _Copy] = {}
_copied_bytes = 0


@functools.cache
def max_bytes() -> int:
    return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") * MEMORY_SHARE)


def copied_bytes() -> int:
    """The bytes the copies alive now hold."""
    return _copied_bytes


def copy_of(
    layout: str,
    sources: tuple[torch.Tensor, ...],
    num_bytes: int,
    make: Callable[[], torch.Tensor],
) -> torch.Tensor | None:
    """The copy of `sources` in `layout` (`make()` builds it, `num_bytes` big, now if none
    is fresh), or None where a source is an inference tensor or the budget is spent."""
    global _copied_bytes
    if any(source.is_inference() for source in sources):
        return None
    key = (layout, id(sources[0]))
    found = _copies.get(key)
    if found is not None and _is_fresh(found, sources):
        return found.copy
    if found is not None:  # stale: a source written since, or new tensors at its id
        _drop(key)
    if _copied_bytes + num_bytes > max_bytes():
        return None
    with torch.inference_mode():
        copy = make()
    refs = (weakref.ref(sources[0], lambda _: _drop(key)),)
    refs += tuple(weakref.ref(source) for source in sources[1:])
    _copies[key] = _Copy(refs, tuple(source._version for source in sources), copy)
    _copied_bytes += _size(copy)
    return copy


def _is_fresh(found: _Copy, sources: tuple[torch.Tensor, ...]) -> bool:
    return len(found.sources) == len(sources) and all(
        ref() is source and version == source._version
        for ref, version, source in zip(found.sources, found.versions, sources, strict=True)
    )


def _size(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _drop(key: tuple[str, int]) -> None:
    global _copied_bytes
    found = _copies.pop(key, None)
    if found is not None:
        _copied_bytes -= _size(found.copy)
