"""DESIGN.md section 5's determinism policy for greedy comparisons, as one assertion.

Two greedy runs must be identical, or diverge only at a near-tie: at the first
differing position the reference's top-2 logits differ by less than 1e-4 x the logit
scale (max |logit|). Nothing looser.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import torch


def assert_greedy_equivalent(
    ours: list[int],
    reference: list[int],
    reference_logits: Callable[[list[int]], torch.Tensor],
    context: list[int],
    label: str = "",
    stop_token_ids: Collection[int] = (),
) -> None:
    """`reference_logits(tokens)` gives the reference's next-token logits [V] after tokens.

    Where the runs agree on every common position they must be equally long, unless the
    shorter one ends with one of `stop_token_ids` (the longer one then chose it too, and
    went on only because it ignores stops).
    """
    length = min(len(ours), len(reference))
    for i in range(length):
        if ours[i] == reference[i]:
            continue
        logits = reference_logits(context + reference[:i])
        top2 = logits.topk(2).values
        gap, scale = float(top2[0] - top2[1]), float(logits.abs().max())
        assert gap < 1e-4 * scale, (
            f"{label}: greedy outputs diverge at token {i} ({ours[i]} vs {reference[i]}) "
            f"where the reference's top-2 gap {gap:.3g} is not a near-tie (scale {scale:.3g})"
        )
        return
    if len(ours) != len(reference):
        shorter = ours if len(ours) < len(reference) else reference
        assert shorter and shorter[-1] in stop_token_ids, (
            f"{label}: greedy outputs agree on {length} tokens, then one ends without a stop "
            f"token ({len(ours)} tokens vs the reference's {len(reference)})"
        )
