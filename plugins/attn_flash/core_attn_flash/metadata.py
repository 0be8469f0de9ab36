"""The flash backend's per-step metadata, built into persistent device buffers.

The kernels read the batch layout (query_start_loc, seq_lens, block_table, slot_mapping)
from device memory and take only four host integers (num_reqs, num_actual_tokens,
max_query_len, max_seq_len) for their launch configuration. So a captured device graph
stays valid on replay as long as each step's values land in the same buffers: `build`
copies them in and returns views of those buffers (same data_ptr every step).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from core.attention.interface import (
    AttentionMetadataBuilder,
    BuilderLimits,
    CommonAttentionMetadata,
)

__all__ = [
    "FlashAttentionMetadata",
    "FlashAttentionMetadataBuilder",
    "SplitKVPartials",
    "SplitKVScratch",
]


@dataclass(frozen=True)
class SplitKVPartials:
    """Per-split results of the split-KV decode, before the reduce combines them.

    `maxes` and `sums` are the running softmax max (in log2 units: scores scaled by
    scale * log2(e)) and denominator of each split; `acc` its unnormalized output.
    """

    acc: torch.Tensor  # [R, Hq, num_splits, block_d] float32
    maxes: torch.Tensor  # [R, Hq, num_splits] float32
    sums: torch.Tensor  # [R, Hq, num_splits] float32


class SplitKVScratch:
    """The split-KV decode's partial results, shared by every layer of a KV-cache group
    (layers run one after another, so one set of buffers serves them all).

    Its size depends on the query head count, which the builder does not know (the
    KV-cache spec names only KV heads), so the first layer that takes the split path
    allocates it, for at least the reserved number of requests; later calls get views
    of the same memory. In a captured graph that decode step must have run once before
    capture (the warm-up run), so capture allocates nothing.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.min_reqs = 0
        self._acc: torch.Tensor | None = None  # [R, Hq, num_splits, block_d]
        self._maxes_sums: torch.Tensor | None = None  # [2, R, Hq, num_splits]

    def partials(
        self, num_reqs: int, num_heads: int, num_splits: int, block_d: int
    ) -> SplitKVPartials:
        """Views of `num_reqs` requests' partials; grows the buffers when they are short."""
        acc = self._acc
        if (
            acc is None
            or acc.shape[0] < num_reqs
            or acc.shape[1:]
            != (
                num_heads,
                num_splits,
                block_d,
            )
        ):
            rows = max(num_reqs, self.min_reqs, 0 if acc is None else acc.shape[0])
            shape = (rows, num_heads, num_splits)
            self._acc = torch.empty(*shape, block_d, dtype=torch.float32, device=self.device)
            self._maxes_sums = torch.empty(2, *shape, dtype=torch.float32, device=self.device)
        maxes_sums = self._maxes_sums[:, :num_reqs]
        return SplitKVPartials(self._acc[:num_reqs], maxes_sums[0], maxes_sums[1])


@dataclass
class FlashAttentionMetadata:
    """What each layer of a KV-cache group receives for one step.

    The tensors are views of the builder's persistent buffers. Request i's new tokens are
    rows [query_start_loc[i], query_start_loc[i + 1]) of the step's query/key/value, at
    positions [seq_lens[i] - (their count), seq_lens[i]); a request with no new tokens (a
    padding request) produces nothing. Slot -1 means "do not write this row's K/V".
    `max_query_len` and `max_seq_len` may be upper bounds (padded batches under graph
    capture): the kernels take them for launch configuration only.
    """

    query_start_loc: torch.Tensor  # [num_reqs + 1] int32
    seq_lens: torch.Tensor  # [num_reqs] int32
    block_table: torch.Tensor  # [num_reqs, max_num_blocks] int32
    slot_mapping: torch.Tensor  # [num_actual_tokens] int64
    num_reqs: int
    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int
    split_kv: SplitKVScratch


class FlashAttentionMetadataBuilder(AttentionMetadataBuilder):
    """CommonAttentionMetadata -> FlashAttentionMetadata, through persistent buffers.

    `reserve` sizes the buffers for the largest step; without it (or for a larger step)
    `build` grows them, which is fine for eager steps but would invalidate a captured
    graph, hence the worker's `reserve` call before capture.
    """

    def __init__(self, kv_cache_spec, layer_names: list[str], device: torch.device) -> None:
        super().__init__(kv_cache_spec, layer_names, device)
        self.split_kv = SplitKVScratch(device)
        self._query_start_loc = torch.zeros(1, dtype=torch.int32, device=device)
        self._seq_lens = torch.zeros(0, dtype=torch.int32, device=device)
        self._block_table = torch.zeros(0, 0, dtype=torch.int32, device=device)
        self._slot_mapping = torch.zeros(0, dtype=torch.int64, device=device)

    def reserve(self, limits: BuilderLimits) -> None:
        max_num_blocks = -(-limits.max_model_len // self.kv_cache_spec.block_size)
        self._grow(limits.max_num_reqs, limits.max_num_tokens, max_num_blocks)
        self.split_kv.min_reqs = limits.max_num_reqs

    def build(self, common: CommonAttentionMetadata) -> FlashAttentionMetadata:
        num_reqs, num_tokens = common.num_reqs, common.num_actual_tokens
        # Only the columns a context of max_seq_len can reach are read: a wider table (the
        # runner's, say) never outgrows the reserved buffer.
        reach = -(-common.max_seq_len // self.kv_cache_spec.block_size)
        width = min(common.block_table.shape[1], reach)
        self._grow(num_reqs, num_tokens, width)
        return FlashAttentionMetadata(
            query_start_loc=_copy_in(self._query_start_loc, common.query_start_loc[: num_reqs + 1]),
            seq_lens=_copy_in(self._seq_lens, common.seq_lens[:num_reqs], tail=0),
            block_table=self._copy_block_table(common.block_table[:num_reqs, :width]),
            slot_mapping=_copy_in(self._slot_mapping, common.slot_mapping[:num_tokens], tail=-1),
            num_reqs=num_reqs,
            num_actual_tokens=num_tokens,
            max_query_len=common.max_query_len,
            max_seq_len=common.max_seq_len,
            split_kv=self.split_kv,
        )

    def _copy_block_table(self, block_table: torch.Tensor) -> torch.Tensor:
        """Rows [:num_reqs] at full buffer width, so the view's shape and strides depend on
        num_reqs alone; columns and rows past the step's are zeroed (block 0, the null block)."""
        num_reqs, width = block_table.shape
        self._block_table[:num_reqs, :width].copy_(block_table, non_blocking=True)
        self._block_table[:num_reqs, width:].zero_()
        self._block_table[num_reqs:].zero_()
        return self._block_table[:num_reqs]

    def _grow(self, num_reqs: int, num_tokens: int, num_blocks: int) -> None:
        """Reallocate any buffer too small for the sizes given (never shrinks)."""
        if self._seq_lens.shape[0] < num_reqs:
            self._query_start_loc = self._new(num_reqs + 1, dtype=torch.int32)
            self._seq_lens = self._new(num_reqs, dtype=torch.int32)
        rows, cols = self._block_table.shape
        if rows < num_reqs or cols < num_blocks:
            self._block_table = self._new(max(rows, num_reqs), max(cols, num_blocks))
        if self._slot_mapping.shape[0] < num_tokens:
            self._slot_mapping = self._new(num_tokens, dtype=torch.int64)

    def _new(self, *shape: int, dtype: torch.dtype = torch.int32) -> torch.Tensor:
        return torch.zeros(*shape, dtype=dtype, device=self.device)


def _copy_in(buffer: torch.Tensor, values: torch.Tensor, tail: int | None = None) -> torch.Tensor:
    """Copy `values` into the head of `buffer` and return that head as a view.

    The tail is set to `tail`, or, when None, to the last value (query_start_loc: every
    request past the step's then has no tokens). Kernels never read past the head; the
    fill keeps stale values of an earlier, larger step out of a replayed graph's reach.
    """
    count = values.shape[0]
    head = buffer[:count]
    head.copy_(values, non_blocking=True)
    if tail is None:
        buffer[count:].copy_(head[-1:].expand(buffer.shape[0] - count))
    else:
        buffer[count:].fill_(tail)
    return head
