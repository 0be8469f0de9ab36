"""Linear layers through oneDNN's matmul on each weight reordered once into its blocked layout.

On an AVX2 EPYC (float32, 2 threads) oneDNN on the packed weight took 0.76-0.92x MKL's time
on SmolLM2's decoder linears at 32-64 rows and 0.56-0.77x on its 49,152-row head; on an AMX
Xeon (bfloat16) 1.2-2x faster than torch's matmul on the weight as it is at decode batch
sizes (../shared/measurements/intel-amx-2026-12-06.md). Whether it serves a given layer and
row count is measured at start (candidates.py). The packed copy is one of weight_copies.py's:
made once per weight, remade when the weight is written, within the budget all such copies
share (past it, weights go unpacked to torch).
"""

from __future__ import annotations

import functools

import torch

from core_cpu_kernels import weight_copies


@functools.cache
def available() -> bool:
    """Whether this torch has oneDNN (mkldnn) and its linear ops."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


@functools.cache
def takes(dtype: torch.dtype) -> bool:
    """Whether oneDNN multiplies `dtype` here: float32 always; bfloat16 and float16 where
    torch says this CPU has oneDNN's instructions for them (it refuses to reorder
    otherwise)."""
    if dtype is torch.float32:
        return True
    if dtype is torch.bfloat16:
        return torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return False


def reorder(weight: torch.Tensor) -> torch.Tensor:
    """`weight` [N, K] in oneDNN's blocked layout (a new tensor)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)


def packed_weight(weight: torch.Tensor) -> torch.Tensor | None:
    """`weight`'s oneDNN-packed copy (made now if missing or stale), or None where it can
    have none (an inference tensor, or the budget spent)."""
    return weight_copies.copy_of(
        "onednn", (weight,), weight.numel() * weight.element_size(), lambda: reorder(weight)
    )


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ W^T + bias with W's packed copy."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
