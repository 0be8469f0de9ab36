"""LogitsProcessors: an engine's custom logits processors (core.sample.logits_processor),
kept in step with the worker's batch and applied by the sampler.

Not to be confused with `core.sample.processors`, the built-in processing (logit bias,
min_tokens, min_p...) that every sampler applies from SamplingMetadata's own fields.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from core.sample.logits_processor import BatchUpdate, LogitsProcessor

__all__ = ["LogitsProcessors", "StepLogitsProcessors"]


class LogitsProcessors:
    """One worker's processors, split by whether they can move a row's argmax."""

    def __init__(self, processors: Sequence[LogitsProcessor]) -> None:
        self.non_argmax_invariant = [p for p in processors if not p.is_argmax_invariant()]
        self.argmax_invariant = [p for p in processors if p.is_argmax_invariant()]

    @property
    def all(self) -> list[LogitsProcessor]:
        return self.non_argmax_invariant + self.argmax_invariant

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Hand every processor the batch's changes of this step (None: none)."""
        for processor in self.all:
            processor.update_state(batch_update)

    def of_step(self, rows: Sequence[int], batch_size: int) -> StepLogitsProcessors | None:
        """What the sampler applies to a step's logits whose row i is batch row `rows[i]`
        (ascending) in a batch of `batch_size`; None when there is no processor."""
        if not self.all:
            return None
        whole = list(rows) == list(range(batch_size))
        return StepLogitsProcessors(self, None if whole else list(rows), batch_size)


@dataclass(frozen=True)
class StepLogitsProcessors:
    """The custom processors of one sampling step (SamplingMetadata.logits_processors).

    The sampler's logits hold the rows that sample this step; the processors see the whole
    batch, row for row. `rows` maps the first to the second (None: they are the same);
    rows that do not sample (a prompt's partial chunk) are shown as zeros, and whatever a
    processor makes of them is dropped.
    """

    processors: LogitsProcessors
    rows: list[int] | None
    batch_size: int

    def apply(self, logits: torch.Tensor, argmax_invariant: bool) -> torch.Tensor:
        """`logits` [num_rows, V] float32 after the argmax-invariant processors (True) or
        the others (False); `logits` itself is never modified."""
        chosen = (
            self.processors.argmax_invariant
            if argmax_invariant
            else self.processors.non_argmax_invariant
        )
        if not chosen:
            return logits
        # A processor may work in place: it gets a copy, so the sampler's input stays as is.
        if self.rows is None:
            batch = logits.clone()
        else:
            batch = logits.new_zeros(self.batch_size, logits.shape[-1])  # [batch_size, V]
            batch[self.rows] = logits
        for processor in chosen:
            batch = processor.apply(batch)
        return batch if self.rows is None else batch[self.rows]
