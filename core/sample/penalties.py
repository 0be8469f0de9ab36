"""Repetition, frequency and presence penalties: pure functions of a [B, V] tensor.

Token lists are padded to a rectangle with ``vocab_size``, an id one past the vocabulary:
counting scatters into V + 1 columns and drops the last one, so padding costs no mask.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = [
    "apply_presence_frequency_penalties",
    "apply_repetition_penalty",
    "count_tokens",
    "pad_token_ids",
]


def pad_token_ids(
    token_ids: Sequence[Sequence[int]], vocab_size: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Pad ragged token lists with ``vocab_size`` into an int64 tensor [B, max_len]."""
    max_len = max((len(ids) for ids in token_ids), default=0)
    padded = [list(ids) + [vocab_size] * (max_len - len(ids)) for ids in token_ids]
    return torch.tensor(padded, dtype=torch.int64, device=device).reshape(len(token_ids), max_len)


def count_tokens(padded_token_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """How often each token occurs per row: padded_token_ids [B, L] -> counts [B, V] int64."""
    num_rows = padded_token_ids.shape[0]
    counts = torch.zeros(
        num_rows, vocab_size + 1, dtype=torch.int64, device=padded_token_ids.device
    )  # [B, V + 1]; the last column collects the padding
    counts.scatter_add_(1, padded_token_ids, torch.ones_like(padded_token_ids))
    return counts[:, :vocab_size]


def apply_repetition_penalty(
    logits: torch.Tensor, seen_mask: torch.Tensor, penalties: torch.Tensor
) -> torch.Tensor:
    """Hugging Face semantics: a seen token's positive logit is divided by the penalty,
    its negative logit multiplied, so a penalty > 1 always makes it less likely.

    logits: [B, V], seen_mask: [B, V] bool (in the prompt or the output), penalties: [B].
    """
    penalty = penalties.to(logits.dtype).unsqueeze(-1)  # [B, 1]
    penalized = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen_mask, penalized, logits)


def apply_presence_frequency_penalties(
    logits: torch.Tensor,
    output_counts: torch.Tensor,
    presence_penalties: torch.Tensor,
    frequency_penalties: torch.Tensor,
) -> torch.Tensor:
    """OpenAI semantics on generated tokens only:
    logit -= frequency_penalty * count + presence_penalty * (count > 0).

    logits: [B, V], output_counts: [B, V], penalties: [B] each.
    """
    counts = output_counts.to(logits.dtype)
    frequency = frequency_penalties.to(logits.dtype).unsqueeze(-1) * counts
    presence = presence_penalties.to(logits.dtype).unsqueeze(-1) * (counts > 0).to(logits.dtype)
    return logits - frequency - presence
