"""Per-row block tables of the persistent batch, one per KV-cache group.

Rows live in preallocated numpy arrays updated incrementally (a step appends the few
new block ids of a request), and torch tensors share their memory, so preparing a step
never rebuilds the table.
"""

from __future__ import annotations

import numpy as np
import torch


class BlockTable:
    def __init__(self, max_num_reqs: int, max_num_blocks_per_req: int, block_size: int) -> None:
        self.block_size = block_size
        self.table = np.zeros((max_num_reqs, max_num_blocks_per_req), dtype=np.int32)
        self.num_blocks = np.zeros(max_num_reqs, dtype=np.int32)
        self.tensor = torch.from_numpy(self.table)  # shares memory with `table`

    def set_row(self, row: int, block_ids: list[int]) -> None:
        self.num_blocks[row] = 0
        self.append_row(row, block_ids)

    def append_row(self, row: int, block_ids: list[int]) -> None:
        start = int(self.num_blocks[row])
        end = start + len(block_ids)
        if end > self.table.shape[1]:
            raise ValueError(f"request needs {end} blocks, more than max_model_len allows")
        self.table[row, start:end] = block_ids
        self.num_blocks[row] = end

    def move_row(self, src: int, dst: int) -> None:
        count = int(self.num_blocks[src])
        self.table[dst, :count] = self.table[src, :count]
        self.num_blocks[dst] = count

    def slot_mapping(self, rows: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Cache slot of each token: rows, positions: [T] -> [T] int64."""
        block_ids = self.table[rows, positions // self.block_size].astype(np.int64)
        return block_ids * self.block_size + positions % self.block_size
