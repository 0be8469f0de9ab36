"""The persistent batch: the worker's per-request state, kept across steps.

Requests are added, removed and condensed step to step instead of rebuilt, so the
per-step host work depends on the tokens scheduled, not on the total context length.
Rows [0, num_reqs) are dense after `condense()`; the step's order is the row order.
Every change is also noted in `changes`, which the runner hands to the custom logits
processors once per step (they keep per-row state).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np
import torch

from core.lora.request import LoRARequest
from core.multimodal.inputs import MultiModalFeature
from core.pooling.params import PoolingParams
from core.sample.batch_update import BatchUpdateBuilder
from core.sampling_params import SamplingParams
from core.worker.block_table import BlockTable


@dataclass
class CachedRequestState:
    """What a worker remembers of a request between steps."""

    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams | None  # None: a pooled request (pooling_params)
    generator: torch.Generator | None
    block_ids: tuple[list[int], ...]
    num_computed_tokens: int
    output_token_ids: list[int] = field(default_factory=list)
    lora_request: LoRARequest | None = None
    pooling_params: PoolingParams | None = None
    mm_features: list[MultiModalFeature] = field(default_factory=list)  # in prompt order
    # M-RoPE models: the prompt's [3, P] positions and the offset of later positions.
    mrope: tuple[np.ndarray, int] | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)


class InputBatch:
    def __init__(
        self,
        max_num_reqs: int,
        max_model_len: int,
        block_sizes: list[int],
    ) -> None:
        self.max_model_len = max_model_len
        self.token_ids = np.zeros((max_num_reqs, max_model_len), dtype=np.int64)
        self.num_tokens = np.zeros(max_num_reqs, dtype=np.int64)
        self.num_computed_tokens = np.zeros(max_num_reqs, dtype=np.int64)
        self.block_tables = [
            BlockTable(max_num_reqs, -(-max_model_len // size), size) for size in block_sizes
        ]
        self.rows: list[CachedRequestState | None] = [None] * max_num_reqs
        self.req_id_to_row: dict[str, int] = {}
        self._holes: list[int] = []  # free rows below the highest used one (a min-heap)
        self._end = 0  # one past the highest row ever used since the last condense
        self.changes = BatchUpdateBuilder()  # the rows' changes since the last build

    @property
    def num_reqs(self) -> int:
        return len(self.req_id_to_row)

    @property
    def req_ids(self) -> list[str]:
        return [state.req_id for state in self.rows[: self.num_reqs] if state is not None]

    def add(self, state: CachedRequestState) -> None:
        if state.num_tokens > self.max_model_len:
            raise ValueError(f"request {state.req_id} exceeds max_model_len {self.max_model_len}")
        row = heapq.heappop(self._holes) if self._holes else self._end
        if row >= len(self.rows):
            raise ValueError(f"the batch holds at most {len(self.rows)} requests")
        self._end = max(self._end, row + 1)
        self.rows[row] = state
        self.req_id_to_row[state.req_id] = row
        tokens = state.prompt_token_ids + state.output_token_ids
        self.token_ids[row, : len(tokens)] = tokens
        self.num_tokens[row] = len(tokens)
        self.num_computed_tokens[row] = state.num_computed_tokens
        for table, block_ids in zip(self.block_tables, state.block_ids, strict=True):
            table.set_row(row, block_ids)
        if state.sampling_params is not None:
            self.changes.added(
                row, state.sampling_params, state.prompt_token_ids, state.output_token_ids
            )

    def remove(self, req_id: str) -> None:
        row = self.req_id_to_row.pop(req_id)
        self.rows[row] = None
        heapq.heappush(self._holes, row)
        self.changes.removed(row)

    def condense(self) -> None:
        """Move the last rows into the holes so rows [0, num_reqs) are all in use."""
        last = self._end - 1
        while self._holes:
            hole = heapq.heappop(self._holes)
            while last > hole and self.rows[last] is None:
                last -= 1
            if last <= hole:
                break
            self._move(last, hole)
            last -= 1
        self._holes.clear()
        self._end = self.num_reqs

    def _move(self, src: int, dst: int) -> None:
        state = self.rows[src]
        assert state is not None  # guarded by condense: internal invariant, not user input
        count = int(self.num_tokens[src])
        self.token_ids[dst, :count] = self.token_ids[src, :count]
        self.num_tokens[dst] = count
        self.num_computed_tokens[dst] = self.num_computed_tokens[src]
        for table in self.block_tables:
            table.move_row(src, dst)
        self.rows[dst], self.rows[src] = state, None
        self.req_id_to_row[state.req_id] = dst
        self.changes.moved(src, dst)

    def append_token(self, row: int, token_id: int) -> None:
        state = self.rows[row]
        if state is None:
            raise KeyError(f"row {row} is empty")
        state.output_token_ids.append(token_id)
        count = int(self.num_tokens[row])
        if count < self.max_model_len:
            self.token_ids[row, count] = token_id
        self.num_tokens[row] = count + 1
