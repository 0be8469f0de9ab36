"""Logprobs of chosen tokens: top-k alternatives and the chosen token's rank.

Both sampled-token logprobs and prompt logprobs come out of ``gather_logprobs``, so the two
share one layout: column 0 is the chosen token, columns 1..k the k most likely tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["LogprobsTensors", "compute_logprobs", "compute_prompt_logprobs", "gather_logprobs"]


@dataclass
class LogprobsTensors:
    """Logprobs of N positions (requests for sampling, prompt positions for prompt logprobs).

    logprob_token_ids:    [N, k + 1] int64; column 0 the chosen token, then the top k
    logprobs:             [N, k + 1] float32, aligned with ``logprob_token_ids``
    selected_token_ranks: [N] int64; rank of the chosen token, 1 = most likely
    k is the largest number requested in the batch; callers slice each row to its own.
    """

    logprob_token_ids: torch.Tensor
    logprobs: torch.Tensor
    selected_token_ranks: torch.Tensor


def compute_logprobs(logits: torch.Tensor) -> torch.Tensor:
    """log_softmax over the vocabulary in float32 (low precision loses the tail)."""
    return torch.log_softmax(logits.to(torch.float32), dim=-1)


def gather_logprobs(
    logprobs: torch.Tensor, token_ids: torch.Tensor, num_logprobs: int
) -> LogprobsTensors:
    """Pick the chosen tokens' logprobs, their ranks and the top ``num_logprobs`` alternatives.

    logprobs: [N, V] float32, token_ids: [N] int64.
    The rank counts tokens strictly more likely than the chosen one, so tied tokens share
    the better rank.
    """
    vocab_size = logprobs.shape[-1]
    if not 0 <= num_logprobs <= vocab_size:
        raise ValueError(f"num_logprobs must be in [0, {vocab_size}], got {num_logprobs}")
    token_ids = token_ids.to(torch.int64).unsqueeze(-1)  # [N, 1]
    token_logprobs = logprobs.gather(-1, token_ids)  # [N, 1]
    ranks = (logprobs > token_logprobs).sum(dim=-1) + 1  # [N]
    top_logprobs, top_ids = logprobs.topk(num_logprobs, dim=-1)  # [N, k] each
    return LogprobsTensors(
        logprob_token_ids=torch.cat([token_ids, top_ids], dim=-1),  # [N, k + 1]
        logprobs=torch.cat([token_logprobs, top_logprobs], dim=-1),  # [N, k + 1]
        selected_token_ranks=ranks.to(torch.int64),
    )


def compute_prompt_logprobs(
    logits: torch.Tensor, target_ids: torch.Tensor, num_logprobs: int
) -> LogprobsTensors:
    """Prompt logprobs: row i of ``logits`` predicts ``target_ids[i]`` (the next prompt token).

    logits: [T, V] raw logits of T prompt positions, target_ids: [T].
    Like sampled logprobs they come from the raw logits: no penalty or temperature applies.
    """
    if logits.shape[0] != target_ids.shape[0]:
        raise ValueError(
            f"target_ids must have one id per logits row ({logits.shape[0]}), "
            f"got {target_ids.shape[0]}"
        )
    return gather_logprobs(compute_logprobs(logits), target_ids, num_logprobs)
