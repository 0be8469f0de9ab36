"""BatchUpdateBuilder: the persistent batch's changes, collected as they happen and handed
to the logits processors once per step as one BatchUpdate."""

from __future__ import annotations

from core.sample.logits_processor import (
    AddedRequest,
    BatchUpdate,
    MoveDirectionality,
    MovedRequest,
    RemovedRequest,
)
from core.sampling_params import SamplingParams

__all__ = ["BatchUpdateBuilder"]


class BatchUpdateBuilder:
    """What the batch did since the last `build`. The worker's InputBatch calls `removed`,
    `added` and `moved` as it changes, in that order within a step (removals, then
    additions into the freed rows, then the condensing moves), which is the order a
    BatchUpdate is applied in."""

    def __init__(self) -> None:
        self._removed: list[RemovedRequest] = []
        self._added: list[AddedRequest] = []
        self._moved: list[MovedRequest] = []

    def removed(self, row: int) -> None:
        self._removed.append(row)

    def added(
        self, row: int, params: SamplingParams, prompt_ids: list[int], output_ids: list[int]
    ) -> None:
        """`output_ids`: the request's own list, which the worker extends as it samples."""
        self._added.append((row, params, prompt_ids, output_ids))

    def moved(self, source: int, target: int) -> None:
        self._moved.append((source, target, MoveDirectionality.UNIDIRECTIONAL))

    def build(self, batch_size: int) -> BatchUpdate | None:
        """The changes since the last call (None when there were none), and a fresh start."""
        if not (self._removed or self._added or self._moved):
            return None
        update = BatchUpdate(batch_size, self._removed, self._added, self._moved)
        self._removed, self._added, self._moved = [], [], []
        return update
