"""The LogitsProcessor extension point (vLLM v1's interface): custom, batch-level changes to
the logits before a token is sampled.

A processor is a plugin: a `core.logits_processors` entry point, or a class named by
`--logits-processors` / `LLM(logits_processors=[...])` (core.sample.logits_processor_selector).
Each worker builds one instance per class for the engine's life; per-request arguments
travel in `SamplingParams.extra_args` (the server's `vllm_xargs`), and a request whose
arguments do not ask for a processor must come out of it unchanged.

The worker's persistent batch changes every step (requests added, finished, moved down to
fill holes). Before each step the processor hears those changes as a BatchUpdate, so it
keeps per-row state instead of looking at every request each step; then the sampler hands
it the logits of the whole batch, one row per batch row, in DESIGN.md section 5's order:
processors that may change the argmax with the logit bias and min_tokens, before the
penalties; argmax-invariant ones after temperature, beside min_p, and not at all when every
row is greedy (they could not change a greedy token).
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import torch

from core.sampling_params import SamplingParams

if TYPE_CHECKING:
    from core.config import EngineConfig

__all__ = [
    "AddedRequest",
    "BatchUpdate",
    "LogitsProcessor",
    "MoveDirectionality",
    "MovedRequest",
    "RemovedRequest",
    "update_row_states",
]

_State = TypeVar("_State")


class MoveDirectionality(enum.Enum):
    UNIDIRECTIONAL = enum.auto()  # the request at the first row moves to the second
    SWAP = enum.auto()  # the two rows' requests trade places


# (row, params, prompt token ids, output token ids) of a request added to the batch. The
# output list is the request's own, which the worker extends as it samples: a processor
# that keeps it sees every new token.
AddedRequest = tuple[int, SamplingParams, list[int], list[int]]
# (from row, to row, directionality)
MovedRequest = tuple[int, int, MoveDirectionality]
# The row a request left (finished, or not scheduled this step).
RemovedRequest = int


@dataclass(frozen=True)
class BatchUpdate:
    """The persistent batch's changes since the previous step.

    Apply them in this order: `removed`, then `added`, then `moved` (one after another, as
    listed). An added or moved request may take a row another request had: it replaces it.
    `batch_size` is the number of requests in the batch afterwards; they fill rows
    [0, batch_size).
    """

    batch_size: int
    removed: Sequence[RemovedRequest]
    added: Sequence[AddedRequest]
    moved: Sequence[MovedRequest]


class LogitsProcessor(ABC):
    """A custom logits processor. Contract:

    - `__init__(config, device, is_pin_memory)`: once per worker, before the first step;
      `device` is where the logits are, `is_pin_memory` whether host memory may be pinned
      for copies to it.
    - `validate_params(params)`: the frontend calls it for every request before queuing
      it; a ValueError refuses the request (a 400 on the server) saying why.
    - `update_state(batch_update)`: before every step, with the changes since the last
      (None when nothing changed).
    - `apply(logits)`: logits [batch_size, V] float32, row i the request at batch row i;
      returns the processed logits (it may change `logits` in place and return them). Rows
      of requests that do not ask for the processor must be left as they are.
    - `is_argmax_invariant()`: True when it never changes which token of a row is the most
      likely (then it is skipped when every row is greedy); fixed for the instance's life.
    """

    @classmethod
    def validate_params(cls, params: SamplingParams) -> None:
        """Raise ValueError when `params.extra_args` hold arguments this processor refuses."""

    @abstractmethod
    def __init__(self, config: EngineConfig, device: torch.device, is_pin_memory: bool) -> None:
        """Build the processor's state for an engine of `config` on `device`."""

    @abstractmethod
    def is_argmax_invariant(self) -> bool:
        """Whether the processor never changes a row's argmax."""

    @abstractmethod
    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Take the batch's changes since the previous step (None: none)."""

    @abstractmethod
    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """The processed logits [batch_size, V]."""


def update_row_states(
    states: dict[int, _State],
    batch_update: BatchUpdate | None,
    state_of: Callable[[SamplingParams], _State | None],
) -> None:
    """Keep `states` (batch row -> what a processor holds for the request there) through
    `batch_update`: removed rows dropped, added requests' `state_of(params)` taken (None:
    the request does not ask for the processor), moves followed. The bookkeeping most
    processors need, in the BatchUpdate's order."""
    if batch_update is None:
        return
    for row in batch_update.removed:
        states.pop(row, None)
    for row, params, _, _ in batch_update.added:
        state = state_of(params)
        if state is None:
            states.pop(row, None)
        else:
            states[row] = state
    for source, target, direction in batch_update.moved:
        moving, replaced = states.pop(source, None), states.pop(target, None)
        if moving is not None:
            states[target] = moving
        if direction is MoveDirectionality.SWAP and replaced is not None:
            states[source] = replaced
