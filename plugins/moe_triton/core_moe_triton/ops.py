"""core::fused_moe on CUDA devices, served by this package's Triton kernels.

`register` is this distribution's `core.general` entry point: every process that runs a
model calls it before building one, so this module stays import-light (no triton): the
kernels module is imported when the kernel first runs.

The kernel is the usual one of vLLM's lineage: the T x K routed (token, slot) pairs are
sorted by expert into tiles of BLOCK_M rows, each tile one expert's (padded with an
empty slot), so one grouped GEMM launch multiplies every expert's tokens by its own
weights. The first launch computes silu(gate) * up from w13 for each routed slot; the
second multiplies that by w2 and by the slot's routing weight into a float32 [T, K, H]
buffer, which is summed over K and rounded once to hidden's dtype. Slots routed to no
expert (ids outside 0..E-1) fall in no tile and leave their rows of the buffer zero.

Sorting takes only torch ops that need no host synchronization: the launch grids are
sized by an upper bound on the padded row count, and tiles past the last expert's exit.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

import torch

from core.ops import check_fused_moe_args, fused_moe_reference, register_impl

__all__ = ["KERNELS_MODULE", "PROVIDER", "ExpertBlocks", "expert_blocks", "fused_moe_triton"]

PROVIDER = "core-moe-triton"
KERNELS_MODULE = "core_moe_triton.kernels"

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_MIN_BLOCK_M = 16  # tl.dot's smallest tile side
_MAX_BLOCK_M = 64


@dataclass(frozen=True)
class ExpertBlocks:
    """The routed slots grouped by expert, in tiles of `block_m` rows.

    Slot s is (token s // top_k, its (s % top_k)-th choice). Each tile holds slots of one
    expert; an expert's last tile is padded with `num_slots`, a slot no token has. Tiles
    past the last expert's have expert id E and nothing to do.
    """

    sorted_slot_ids: torch.Tensor  # int32 [num_blocks * block_m]
    block_expert_ids: torch.Tensor  # int32 [num_blocks]
    block_m: int
    top_k: int
    num_slots: int  # T * top_k: the padding slot id

    @property
    def num_blocks(self) -> int:
        return self.block_expert_ids.numel()


def expert_blocks(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> ExpertBlocks:
    """Group the slots of `topk_ids` [T, K] by expert into tiles of `block_m` rows.

    Slots with ids outside 0..num_experts-1 land in no tile. Within an expert, slots keep
    their order. The tiles fill a buffer sized for the worst case, so no count has to be
    read back to the host.
    """
    flat_ids = topk_ids.reshape(-1).long()  # [S]
    num_slots = flat_ids.numel()
    routed = (flat_ids >= 0) & (flat_ids < num_experts)
    keys = torch.where(routed, flat_ids, num_experts)  # [S]: unrouted slots sort last
    order = keys.argsort(stable=True)  # [S]: slot ids, grouped by expert
    counts = torch.zeros(num_experts + 1, dtype=torch.long, device=keys.device)
    counts = counts.scatter_add_(0, keys, torch.ones_like(keys))[:num_experts]  # [E]
    padded = (counts + block_m - 1) // block_m * block_m  # [E]
    num_rows = _max_rows(num_slots, num_experts, block_m)
    sorted_keys = keys[order]
    expert = sorted_keys.clamp(max=num_experts - 1)
    rank = torch.arange(num_slots, device=keys.device) - (counts.cumsum(0) - counts)[expert]
    rows = (padded.cumsum(0) - padded)[expert] + rank  # [S]: each sorted slot's row
    rows = torch.where(sorted_keys < num_experts, rows, num_rows)  # unrouted: a spare row
    sorted_slot_ids = torch.full((num_rows + 1,), num_slots, dtype=torch.int32, device=keys.device)
    sorted_slot_ids[rows] = order.int()
    block_ends = (padded // block_m).cumsum(0)  # [E]: one past each expert's last tile
    tiles = torch.arange(num_rows // block_m, device=keys.device)
    block_expert_ids = torch.searchsorted(block_ends, tiles, right=True).int()
    top_k = topk_ids.shape[1]
    return ExpertBlocks(sorted_slot_ids[:num_rows], block_expert_ids, block_m, top_k, num_slots)


def fused_moe_triton(
    hidden: torch.Tensor,  # [T, H]
    w13: torch.Tensor,  # [E, 2 * I, H]
    w2: torch.Tensor,  # [E, H, I]
    topk_weights: torch.Tensor,  # [T, K], any float dtype
    topk_ids: torch.Tensor,  # [T, K], integer; outside 0..E-1: no expert
    kernels: ModuleType | None = None,
) -> torch.Tensor:  # [T, H]
    """core::fused_moe (see `core.ops.fused_moe`) through the Triton kernels of `kernels`,
    by default `core_moe_triton.kernels` (tests pass a copy run by Triton's interpreter).

    Inputs the kernels do not take (see `_takes`) go to core's reference, which also
    raises the op's ValueError for shapes that do not fit."""
    if not _takes(hidden, w13, w2, topk_weights, topk_ids):
        return fused_moe_reference(hidden, w13, w2, topk_weights, topk_ids)
    if kernels is None:
        kernels = importlib.import_module(KERNELS_MODULE)
    num_tokens, size = hidden.shape
    num_experts, inter = w13.shape[0], w13.shape[1] // 2
    top_k = topk_ids.shape[1]
    blocks = expert_blocks(topk_ids, num_experts, _block_m(num_tokens * top_k, num_experts))
    act = hidden.new_empty((num_tokens * top_k, inter))  # rows of unrouted slots: unused
    kernels.gate_up_silu(act, hidden, w13, blocks)
    # float32 so each token's K outputs add up before the one rounding to hidden's dtype.
    slot_out = torch.zeros((num_tokens, top_k, size), dtype=torch.float32, device=hidden.device)
    kernels.down_weighted(slot_out.view(-1, size), act, w2, topk_weights, blocks)
    return slot_out.sum(dim=1).to(hidden.dtype)


def register() -> None:
    """Serve core::fused_moe on "cuda" with this package's kernel (re-entrant)."""
    register_impl("fused_moe", "cuda", fused_moe_triton, PROVIDER)


def _takes(
    hidden: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> bool:
    """Whether the kernels take these: hidden, w13 and w2 of one dtype of `_DTYPES`, shapes
    that fit each other (the reference names the one that does not), floating weights and
    integer ids, one device, and no empty dimension (a launch grid must not be empty)."""
    tensors = (hidden, w13, w2, topk_weights, topk_ids)
    if hidden.dtype not in _DTYPES or not (w13.dtype is w2.dtype is hidden.dtype):
        return False
    if any(t.device != hidden.device for t in tensors) or any(t.numel() == 0 for t in tensors):
        return False
    if not topk_weights.is_floating_point():
        return False
    try:
        check_fused_moe_args(*tensors)
    except ValueError:
        return False  # the reference raises it, naming the argument
    return True


def _block_m(num_slots: int, num_experts: int) -> int:
    """Rows per tile: about an expert's average share of the slots (a tile's padding is
    wasted work), a power of two from 16 (decode) to 64 (prefill)."""
    share = -(-num_slots // num_experts)
    return min(_MAX_BLOCK_M, max(_MIN_BLOCK_M, 1 << (share - 1).bit_length()))


def _max_rows(num_slots: int, num_experts: int, block_m: int) -> int:
    """An upper bound on the padded rows: each expert with slots pads at most block_m - 1,
    and the total is a whole number of tiles."""
    bound = num_slots + min(num_experts, num_slots) * (block_m - 1)
    return bound // block_m * block_m
