"""core::quant_linear on CUDA devices, served by this package's Triton kernel.

`register` is this distribution's `core.general` entry point: every process that runs a
model calls it before building one, so this module stays import-light (no triton): the
kernels module is imported when the kernel first runs.

The kernel multiplies x by core's packed layout (see `core.ops.quant_linear`) without
ever dequantizing W: each program computes one tile of the output and walks its slice of
K in steps that lie inside one group, so a step needs one scale and one min per output.
Within a group W = s * q + m, so x W^T = s * (x . q) + m * sum(x): the integers q are
exact in every activation dtype, x . q runs on the GPU's native dot products with float32
sums, and the group's scale and min are applied to float32 partial sums.

Few rows (decode) leave most of a GPU idle with one program per output tile, so K is then
split across programs (`Tiles.split_k`): each writes its partial sums to a float32
buffer, which torch adds in a fixed order (deterministic, unlike atomics) before the one
rounding to x's dtype.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

import torch

from core.ops import quant_linear_reference, register_impl
from core.ops.quant_linear import check_layout, group_size, num_inputs

__all__ = ["KERNELS_MODULE", "PROVIDER", "Tiles", "choose_tiles", "quant_linear_triton", "register"]

PROVIDER = "core-quant-triton"
KERNELS_MODULE = "core_quant_triton.kernels"

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_MIN_TILE = 16  # tl.dot's smallest tile side
_MAX_BLOCK_M = 64
_MAX_BLOCK_N = 64
# A decode tile has 16 rows, so its K steps can be long (fewer, larger weight loads); a
# prefill's 64-row tiles keep them shorter to stay within a ROCm GPU's 64 KiB of shared
# memory per block.
_MAX_BLOCK_K_DECODE = 128
_MAX_BLOCK_K = 64
# Enough programs to occupy every SM of a large GPU (132 on an H100) before splitting K.
_TARGET_PROGRAMS = 256


@dataclass(frozen=True)
class Tiles:
    """One launch's tiling: programs of block_m x block_n outputs, K in steps of block_k
    (a power of two dividing the group size, so a step is inside one group), split
    across `split_k` programs per output tile, each taking whole steps."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1


def choose_tiles(rows: int, outputs: int, inputs: int, group: int) -> Tiles:
    """The tiling of x [rows, inputs] times W [outputs, inputs] in groups of `group`.

    Tiles grow with rows and outputs from tl.dot's 16 to 64; K is split (evenly, so no
    split is empty) until about `_TARGET_PROGRAMS` programs run or every step has its own.
    """
    block_m = _block(rows, _MAX_BLOCK_M)
    block_n = _block(outputs, _MAX_BLOCK_N)
    max_block_k = _MAX_BLOCK_K_DECODE if block_m == _MIN_TILE else _MAX_BLOCK_K
    block_k = min(group & -group, max_block_k)  # the largest power of two dividing G
    tiles = -(-rows // block_m) * -(-outputs // block_n)
    steps = inputs // block_k
    split = max(1, min(steps, _TARGET_PROGRAMS // tiles))
    per_split = -(-steps // split)
    return Tiles(block_m, block_n, block_k, split_k=-(-steps // per_split))


def quant_linear_triton(
    x: torch.Tensor,  # [T, K]
    qweight: torch.Tensor,
    scales: torch.Tensor,
    mins: torch.Tensor,
    bits: int,
    kernels: ModuleType | None = None,
    tiles: Tiles | None = None,
) -> torch.Tensor:  # [T, N], x.dtype
    """core::quant_linear (see `core.ops.quant_linear`) through the Triton kernel of
    `kernels`, by default `core_quant_triton.kernels` (tests pass a copy run by Triton's
    interpreter), tiled by `tiles`, by default `choose_tiles`'s (tests force others).

    Inputs the kernel does not take (see `_takes`) go to core's reference, which also
    raises for shapes that do not fit."""
    if not _takes(x, qweight, scales, mins, bits):
        return quant_linear_reference(x, qweight, scales, mins, bits)
    if kernels is None:
        kernels = importlib.import_module(KERNELS_MODULE)
    rows, outputs = x.shape[0], qweight.shape[0]
    if tiles is None:
        group = group_size(qweight, scales, bits)
        tiles = choose_tiles(rows, outputs, x.shape[1], group)
    if tiles.split_k == 1:  # the kernel rounds its float32 sums to x's dtype itself
        out = x.new_empty((1, rows, outputs))
        kernels.quant_gemm(out, x, qweight, scales, mins, bits, tiles)
        return out[0]
    partial = torch.empty((tiles.split_k, rows, outputs), dtype=torch.float32, device=x.device)
    kernels.quant_gemm(partial, x, qweight, scales, mins, bits, tiles)
    return partial.sum(dim=0).to(x.dtype)


def register() -> None:
    """Serve core::quant_linear on "cuda" with this package's kernel (re-entrant)."""
    register_impl("quant_linear", "cuda", quant_linear_triton, PROVIDER)


def _takes(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, bits: int
) -> bool:
    """Whether the kernel takes these: x 2-D in one dtype of `_DTYPES`, one packed weight
    (`check_layout`) with x's number of inputs, one device, and no empty dimension (a
    launch grid must not be empty)."""
    tensors = (x, qweight, scales, mins)
    if x.dtype not in _DTYPES or x.dim() != 2:
        return False
    if any(t.device != x.device for t in tensors) or any(t.numel() == 0 for t in tensors):
        return False
    try:
        check_layout(qweight, scales, mins, bits, "quant_linear")
    except ValueError:
        return False  # not one packed weight: the reference fails on it as it may
    return x.shape[1] == num_inputs(qweight, bits)


def _block(extent: int, largest: int) -> int:
    """A tile side for a dimension of `extent`: its next power of two, within [16, largest]."""
    return min(largest, max(_MIN_TILE, 1 << (extent - 1).bit_length()))
