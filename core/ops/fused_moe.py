"""A mixture-of-experts MLP as a kernel op: each token through its routed experts' gated
MLPs, the outputs weighted and summed.

    out[t] = sum_j topk_weights[t, j] * w2[e] @ silu_and_mul(w13[e] @ x[t]),  e = topk_ids[t, j]

`w13[e]` is expert e's gate and up projections stacked ([2 * I, H]: gate rows first),
`w2[e]` its down projection ([H, I]). An id outside 0..E-1 (-1 by convention) routes the
slot to no expert: it adds nothing. That is how expert parallelism hands a rank the
tokens of experts it does not hold. Routing (scoring, top-k, renormalization) is the
model's; the op takes its result.

The reference groups the routed slots by expert and runs one pair of matmuls per expert
over its tokens, as transformers' MoE blocks do. It adds each expert's weighted output
in the hidden dtype, in expert order. A kernel may accumulate in float32 and round once,
hence the half-precision tolerances.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from core import batch_invariant
from core.ops.registry import CORE_OPS
from core.ops.samples import Conformance, OpSample, Tolerance, randn

TOLERANCES = {
    torch.float32: Tolerance(rtol=1e-4, atol=1e-5),
    torch.bfloat16: Tolerance(rtol=3e-2, atol=3e-2),
}


def fused_moe_reference(
    hidden: torch.Tensor,  # [T, H]
    w13: torch.Tensor,  # [E, 2 * I, H]
    w2: torch.Tensor,  # [E, H, I]
    topk_weights: torch.Tensor,  # [T, K], any float dtype
    topk_ids: torch.Tensor,  # [T, K], integer; outside 0..E-1: no expert
) -> torch.Tensor:  # [T, H]
    """Each token through its routed experts (one token at a time in batch-invariant
    mode: an expert's matmul otherwise multiplies all of its tokens together)."""
    check_fused_moe_args(hidden, w13, w2, topk_weights, topk_ids)
    if batch_invariant.enabled():
        return batch_invariant.rowwise(_fused_moe, (hidden, topk_weights, topk_ids), w13, w2)
    return _fused_moe(hidden, topk_weights, topk_ids, w13, w2)


def _fused_moe(
    hidden: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
) -> torch.Tensor:
    out = torch.zeros_like(hidden)
    num_experts = w13.shape[0]
    flat_ids = topk_ids.reshape(-1).long()
    routed = (flat_ids >= 0) & (flat_ids < num_experts)
    slots = routed.nonzero().squeeze(1)
    if slots.numel() == 0:
        return out
    order = flat_ids[slots].argsort(stable=True)
    slots = slots[order]
    experts, counts = flat_ids[slots].unique_consecutive(return_counts=True)
    top_k = topk_ids.shape[1]
    weights = topk_weights.reshape(-1).to(hidden.dtype)
    start = 0
    for expert, count in zip(experts.tolist(), counts.tolist(), strict=True):
        mine = slots[start : start + count]
        start += count
        tokens = mine // top_k
        x = hidden.index_select(0, tokens)
        y = F.linear(_silu_and_mul(F.linear(x, w13[expert])), w2[expert])
        out.index_add_(0, tokens, y * weights[mine, None])
    return out


def _silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def check_fused_moe_args(hidden, w13, w2, topk_weights, topk_ids) -> None:
    """ValueError naming the argument whose shape (or the ids' dtype) does not fit the
    others; kernels that fall back to the reference for such inputs ask it first."""
    if hidden.dim() != 2:
        raise ValueError(f"hidden of fused_moe must be [T, H], got {tuple(hidden.shape)}")
    num_tokens, size = hidden.shape
    if w13.dim() != 3 or w13.shape[2] != size or w13.shape[1] % 2:
        raise ValueError(f"w13 of fused_moe must be [E, 2 * I, {size}], got {tuple(w13.shape)}")
    experts, inter = w13.shape[0], w13.shape[1] // 2
    if tuple(w2.shape) != (experts, size, inter):
        raise ValueError(f"w2 of fused_moe must be [{experts}, {size}, {inter}], "
                         f"got {tuple(w2.shape)}")  # fmt: skip
    if topk_ids.dim() != 2 or topk_ids.shape[0] != num_tokens:
        raise ValueError(f"topk_ids of fused_moe must be [{num_tokens}, K], "
                         f"got {tuple(topk_ids.shape)}")  # fmt: skip
    if topk_ids.is_floating_point():
        raise ValueError(f"topk_ids of fused_moe must be integers, got {topk_ids.dtype}")
    if topk_weights.shape != topk_ids.shape:
        raise ValueError(f"topk_weights of fused_moe must be {tuple(topk_ids.shape)} like "
                         f"topk_ids, got {tuple(topk_weights.shape)}")  # fmt: skip


def _fused_moe_fake(hidden, w13, w2, topk_weights, topk_ids) -> torch.Tensor:
    return hidden.new_empty(hidden.shape)


def _fused_moe_samples(dtype: torch.dtype, device: torch.device) -> list[OpSample]:
    def weights(experts: int, inter: int, size: int, seed: int) -> tuple[torch.Tensor, ...]:
        w13 = randn((experts, 2 * inter, size), dtype, device, seed, scale=size**-0.5)
        w2 = randn((experts, size, inter), dtype, device, seed + 1, scale=inter**-0.5)
        return w13, w2

    def routing(tokens: int, experts: int, top_k: int, seed: int) -> tuple[torch.Tensor, ...]:
        generator = torch.Generator().manual_seed(seed)
        ids = torch.rand(tokens, experts, generator=generator).argsort(dim=1)[:, :top_k]
        probs = torch.rand(tokens, top_k, generator=generator).softmax(dim=1)
        return probs.to(device=device, dtype=torch.float32), ids.to(device)

    def sample(name, tokens, experts, inter, size, top_k, seed, edit=None) -> OpSample:
        hidden = randn((tokens, size), dtype, device, seed)
        w13, w2 = weights(experts, inter, size, seed + 1)
        probs, ids = routing(tokens, experts, top_k, seed + 3)
        if edit is not None:
            ids = edit(ids)
        return OpSample(name, (hidden, w13, w2, probs, ids))

    return [
        sample("one token, top-1 of 4", 1, 4, 16, 32, 1, seed=0),
        sample("top-2 of 8, odd sizes", 7, 8, 24, 40, 2, seed=10),
        sample("top-8 of 8", 5, 8, 16, 32, 8, seed=20),
        sample("every token to expert 3", 9, 6, 16, 32, 1, seed=30,
               edit=lambda ids: torch.full_like(ids, 3)),
        sample("slots routed to no expert (-1)", 6, 4, 16, 32, 2, seed=40,
               edit=lambda ids: torch.where(ids % 2 == 1, -1, ids)),
        sample("no token routed anywhere", 3, 4, 16, 32, 2, seed=50,
               edit=lambda ids: torch.full_like(ids, -1)),
    ]  # fmt: skip


FUSED_MOE = CORE_OPS.declare(
    "fused_moe(Tensor hidden, Tensor w13, Tensor w2, Tensor topk_weights, Tensor topk_ids)"
    " -> Tensor",
    fused_moe_reference,
    _fused_moe_fake,
    Conformance(_fused_moe_samples, TOLERANCES),
)


def fused_moe(
    hidden: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    """`core::fused_moe` through the kernel serving hidden's device type (see FUSED_MOE)."""
    return FUSED_MOE(hidden, w13, w2, topk_weights, topk_ids)
