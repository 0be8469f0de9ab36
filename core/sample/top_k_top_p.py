"""Top-k and top-p (nucleus) truncation as one pure function over a single sort."""

from __future__ import annotations

import torch

__all__ = ["apply_top_k_top_p"]


def apply_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None
) -> torch.Tensor:
    """Keep each row's ``top_k`` most likely tokens, then the smallest prefix of those
    whose probability reaches ``top_p``; every other token becomes -inf.

    logits: [B, V]; top_k: [B] int64 with V for rows without top-k; top_p: [B] with 1.0
    for rows without top-p; None when no row uses it. Top-p renormalizes over the tokens
    top-k kept, as vLLM does. The most likely token always survives, and among equal
    logits the lower token id ranks first (as argmax picks it), so top_k=1 is greedy.
    """
    if top_k is None and top_p is None:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True, stable=True)  # [B, V] each
    positions = torch.arange(logits.shape[-1], device=logits.device)  # [V]
    remove = torch.zeros_like(sorted_logits, dtype=torch.bool)  # [B, V]
    if top_k is not None:
        remove |= positions.unsqueeze(0) >= top_k.unsqueeze(-1)
        sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    if top_p is not None:
        probs = sorted_logits.softmax(dim=-1)  # [B, V]
        mass_before = probs.cumsum(dim=-1) - probs  # [B, V] exclusive prefix sums
        p = top_p.to(probs.dtype).unsqueeze(-1)  # [B, 1]
        # Rows with top_p == 1 skip the test: rounding can push the prefix sum to 1.0
        # before the vocabulary's tail and drop tokens the user never asked to drop.
        remove |= (mass_before >= p) & (p < 1)
    kept = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, kept)
