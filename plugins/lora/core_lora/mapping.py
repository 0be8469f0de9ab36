"""SlotMapping: which adapter slot each token of a forward runs with, in the forms the
LoRA layers multiply with."""

from __future__ import annotations

import torch

from core.lora.interface import NO_SLOT

__all__ = ["SlotMapping"]


class SlotMapping:
    """`token_slots[t]` is the slot of token t's adapter (NO_SLOT: the base model).

    `first`..`end` is the range of slots the forward uses (empty when no token has an
    adapter): layers multiply only those slots' rows of their stacked buffers.
    `foreign(width)` is the [T, (end - first) * width] boolean matrix, True in a token's row
    at the columns of every slot but its own; it is built once per forward and width, and
    shared by every layer of that width.
    """

    def __init__(self, token_slots: torch.Tensor) -> None:
        self.token_slots = token_slots
        used = token_slots[token_slots != NO_SLOT]
        if used.numel():
            self.first, self.end = int(used.min()), int(used.max()) + 1
        else:
            self.first = self.end = 0
        self._foreign: dict[int, torch.Tensor] = {}

    @property
    def active(self) -> bool:
        """Whether any token runs with an adapter."""
        return self.end > self.first

    def foreign(self, width: int) -> torch.Tensor:
        if width not in self._foreign:
            slots = torch.arange(self.first, self.end, device=self.token_slots.device)
            column_slot = slots.repeat_interleave(width)  # [(end - first) * width]
            self._foreign[width] = self.token_slots[:, None] != column_slot[None, :]
        return self._foreign[width]
