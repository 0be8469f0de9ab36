"""float32 linear layers through oneDNN with each weight reordered once into its blocked layout.

For a decode batch (17-128 rows) torch's BLAS (MKL) is slow on a small model's shapes;
oneDNN's matmul on a pre-packed weight measured, with 2 threads on an AMD EPYC (AVX2),
0.76-0.92x MKL's time on SmolLM2's decoder linears at 32-64 rows and 0.56-0.77x on its
49,152-row head at 32-128 rows (about 1.0x at 128 rows with the weights hot in cache, but
in the model, each weight cold from memory, a 128-token prefill's linears took 187 ms
against MKL's 197 ms); larger chunks stay on torch. The packed copy is one of
weight_copies.py's: made once per weight, remade when the weight is written, within the
budget all such copies share (past it, weights go unpacked to torch).
"""

from __future__ import annotations

import functools

import torch

from core_cpu_kernels import weight_copies

MAX_ROWS = 128


@functools.cache
def available() -> bool:
    """Whether this torch has oneDNN (mkldnn) and its linear ops."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def packed_weight(weight: torch.Tensor) -> torch.Tensor | None:
    """`weight`'s oneDNN-packed copy (made now if missing or stale), or None where it can
    have none (an inference tensor, or the budget spent)."""
    return weight_copies.copy_of(
        "onednn",
        (weight,),
        weight.numel() * weight.element_size(),
        lambda: torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None),
    )


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ W^T + bias with W's packed copy."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
