"""Paged batches for the attention checks: requests that grow step by step.

A case fixes the layer's shape (dtype, heads, head size, window) and the block size, and
names a schedule: per step, how many new tokens each request computes. Prefill chunks
(fresh, or on top of context an earlier step cached) and decodes share steps, lengths
land on and next to block edges, and blocks are handed out from a shuffled pool, so
block tables are not contiguous. Everything is built through the public metadata types,
the way the model runner builds it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from core.attention.interface import CommonAttentionMetadata

Schedule = list[dict[int, int]]
"""Per step: request index -> number of new tokens it computes in that step."""


def mixed_schedule(block_size: int) -> Schedule:
    """Fresh prefills, a chunk on cached context and decodes together in every step."""
    b = block_size
    return [
        {0: b + 1, 1: b - 1, 2: b, 3: 2},  # fresh prefills just over, under and at a block
        {0: 1, 1: 2 * b + 1, 2: 1, 3: 1, 4: 2 * b},  # decodes, a chunk on cached context
        {0: 1, 1: 1, 2: 1, 3: b - 2, 4: 1},  # decodes across edges; a chunk up to b + 1
    ]


def block_edge_schedule(block_size: int) -> Schedule:
    """Decodes whose contexts step across block edges (b - 1, b, b + 1, 2b, 2b + 1)."""
    b = block_size
    prefill = {0: b - 2, 1: b - 1, 2: b, 3: 2 * b - 1, 4: 1}
    decode = dict.fromkeys(prefill, 1)
    return [prefill, decode, decode, decode]


SCHEDULES: dict[str, Callable[[int], Schedule]] = {
    "mixed": mixed_schedule,
    "block-edges": block_edge_schedule,
}


@dataclass(frozen=True)
class AttentionCase:
    """One layer configuration and the schedule it runs."""

    dtype: torch.dtype
    head_size: int
    num_kv_heads: int
    gqa_ratio: int  # query heads per KV head
    block_size: int
    sliding_window: int | None
    schedule: str
    layout: str = "layer_outermost"  # or "block_outermost": pages of blocks interleaved
    logits_soft_cap: float | None = None
    kv_cache_dtype: str = "auto"  # a --kv-cache-dtype name: "fp8_e4m3" stores FP8

    @property
    def num_heads(self) -> int:
        return self.num_kv_heads * self.gqa_ratio

    @property
    def id(self) -> str:
        parts = [
            str(self.dtype).removeprefix("torch."),
            f"d{self.head_size}",
            f"gqa{self.gqa_ratio}",
            f"bs{self.block_size}",
            self.schedule,
        ]
        if self.sliding_window is not None:
            parts.append(f"window{self.sliding_window}")
        if self.layout != "layer_outermost":
            parts.append(self.layout.replace("_", "-"))
        if self.logits_soft_cap is not None:
            parts.append(f"softcap{self.logits_soft_cap:g}")
        if self.kv_cache_dtype != "auto":
            parts.append(f"kv-{self.kv_cache_dtype}")
        return "-".join(parts)


@dataclass
class Step:
    """One step of a batch: the requests it computes and the shared metadata."""

    index: int
    req_ids: list[int]
    num_new_tokens: list[int]
    num_computed: list[int]  # context already cached, per request
    common: CommonAttentionMetadata

    def describe(self, row: int, block_size: int) -> str:
        """Request `row` of this step in words, naming the block edge it sits at."""
        new, cached = self.num_new_tokens[row], self.num_computed[row]
        context = cached + new
        edge = _edge_words(context, block_size)
        if cached == 0:
            what = "one-token prompt" if new == 1 else f"fresh prefill of {new} tokens"
        elif new == 1:
            what = "decode"
        else:
            what = f"prefill chunk of {new} tokens on {cached} cached"
        return f"step {self.index}, request {self.req_ids[row]}: {what}, context {context} ({edge})"


class BatchPlan:
    """The block tables and per-step metadata of one case's schedule.

    Blocks come from a shuffled pool of ids 1..num_blocks-1 (block 0 is the null block,
    never handed out), as each request's context reaches a new block; a few blocks are
    left unallocated so a write outside a request's blocks shows.
    """

    SPARE_BLOCKS = 3

    def __init__(
        self, case: AttentionCase, generator: torch.Generator, schedule: Schedule | None = None
    ) -> None:
        """`schedule`: the steps to run, instead of the one the case names."""
        self.case = case
        self.schedule = schedule or SCHEDULES[case.schedule](case.block_size)
        final = _final_lengths(self.schedule)
        needed = sum(-(-length // case.block_size) for length in final.values())
        self.num_blocks = needed + self.SPARE_BLOCKS + 1
        pool = (torch.randperm(self.num_blocks - 1, generator=generator) + 1).tolist()
        self._pool = iter(pool)
        self._blocks: dict[int, list[int]] = {req: [] for req in final}
        self._computed = dict.fromkeys(final, 0)
        # One column more than any request needs: rows are padded with the null block.
        self._width = max(-(-n // case.block_size) for n in final.values()) + 1

    @property
    def allocated_blocks(self) -> list[int]:
        return sorted(b for blocks in self._blocks.values() for b in blocks)

    @property
    def unallocated_blocks(self) -> list[int]:
        allocated = set(self.allocated_blocks)
        return [b for b in range(self.num_blocks) if b not in allocated]

    def steps(self) -> Iterator[Step]:
        for index, scheduled in enumerate(self.schedule, start=1):
            yield self._step(index, scheduled)

    def _step(self, index: int, scheduled: dict[int, int]) -> Step:
        req_ids = list(scheduled)
        counts = [scheduled[r] for r in req_ids]
        computed = [self._computed[r] for r in req_ids]
        slots: list[int] = []
        for req, count, cached in zip(req_ids, counts, computed, strict=True):
            self._grow(req, cached + count)
            slots += [self._slot(req, pos) for pos in range(cached, cached + count)]
            self._computed[req] = cached + count
        seq_lens = [c + n for c, n in zip(computed, counts, strict=True)]
        table = torch.zeros(len(req_ids), self._width, dtype=torch.int32)
        for row, req in enumerate(req_ids):
            table[row, : len(self._blocks[req])] = torch.tensor(self._blocks[req])
        starts = torch.zeros(len(req_ids) + 1, dtype=torch.int32)
        starts[1:] = torch.tensor(counts).cumsum(0)
        common = CommonAttentionMetadata(
            query_start_loc=starts,
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
            num_computed_tokens=torch.tensor(computed, dtype=torch.int32),
            block_table=table,
            slot_mapping=torch.tensor(slots, dtype=torch.int64),
            num_reqs=len(req_ids),
            num_actual_tokens=sum(counts),
            max_query_len=max(counts),
            max_seq_len=max(seq_lens),
        )
        return Step(index, req_ids, counts, computed, common)

    def _grow(self, req: int, length: int) -> None:
        while len(self._blocks[req]) * self.case.block_size < length:
            self._blocks[req].append(next(self._pool))

    def _slot(self, req: int, position: int) -> int:
        block_size = self.case.block_size
        return self._blocks[req][position // block_size] * block_size + position % block_size


def _final_lengths(schedule: Schedule) -> dict[int, int]:
    lengths: dict[int, int] = {}
    for step in schedule:
        for req, count in step.items():
            lengths[req] = lengths.get(req, 0) + count
    return lengths


def _edge_words(context: int, block_size: int) -> str:
    full, rest = divmod(context, block_size)
    if rest == 0:
        return f"exactly {full} block{'s' if full > 1 else ''} of {block_size}"
    if rest == 1:
        where = "one past a block edge" if full else "the first slot of its first block"
        return f"{where}, block size {block_size}"
    if rest == block_size - 1:
        return f"one short of a block edge, block size {block_size}"
    return f"block size {block_size}"


def to_device(common: CommonAttentionMetadata, device: torch.device) -> CommonAttentionMetadata:
    """A copy of `common` with its tensors on `device` (each backend gets its own)."""
    return CommonAttentionMetadata(
        query_start_loc=common.query_start_loc.to(device, copy=True),
        seq_lens=common.seq_lens.to(device, copy=True),
        num_computed_tokens=common.num_computed_tokens.to(device, copy=True),
        block_table=common.block_table.to(device, copy=True),
        slot_mapping=common.slot_mapping.to(device, copy=True),
        num_reqs=common.num_reqs,
        num_actual_tokens=common.num_actual_tokens,
        max_query_len=common.max_query_len,
        max_seq_len=common.max_seq_len,
    )
