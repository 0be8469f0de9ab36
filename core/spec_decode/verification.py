"""The one rule of verification: a request verifying n drafts yields up to n + 1 tokens.

The target computes logits at n + 1 positions (its last known token's, whose logits check
the first draft, and each draft's) and emits the drafts it accepts, then one token of its
own (the correction at the first rejection, or a bonus after the last draft). The
scheduler, the model runner, the speculator and the rejection sampler all count with
`num_verified`; the other two functions are its readings the other way round. Pure
Python, so the scheduler imports it without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    import numpy as np

__all__ = ["num_accepted", "num_drafts_within", "num_verified"]

Count = TypeVar("Count", int, "np.ndarray")  # one request's count, or one per request


def num_verified(num_drafts: Count) -> Count:
    """Positions the target verifies `num_drafts` drafts at, and the most tokens that emits:
    num_verified(3) == 4; elementwise on an array of counts."""
    return num_drafts + 1


def num_drafts_within(room: int) -> int:
    """The most drafts whose verification's tokens all fit in `room` (0 when none does):
    num_drafts_within(4) == 3, num_drafts_within(0) == 0."""
    return max(room - num_verified(0), 0)


def num_accepted(num_emitted: int) -> int:
    """Drafts a verification accepted, given the tokens it emitted (all but the target's
    own): num_accepted(3) == 2."""
    return num_emitted - num_verified(0)
