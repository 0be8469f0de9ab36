"""One step of paged requests for the reference backends' tests: shuffled block tables,
the step's slots, and the metadata the reference builder makes of them."""

from __future__ import annotations

import torch

from core.attention.interface import CommonAttentionMetadata
from core.attention.paged_metadata import PagedAttentionMetadata, PagedAttentionMetadataBuilder
from core.kv_cache.spec import AttentionSpec


def paged_step(
    generator: torch.Generator,
    requests: list[tuple[int, int]],  # (cached tokens, new tokens) per request
    spec: AttentionSpec,
    num_blocks: int,
) -> tuple[list[torch.Tensor], list[int], PagedAttentionMetadata]:
    """Each request's block table (4 distinct shuffled blocks, room for 16 tokens, never
    block 0: the null block), the step's row starts (each request's first row, then the
    row count) and the step's metadata."""
    block_size = spec.block_size
    order = torch.randperm(num_blocks - 1, generator=generator) + 1
    tables = [order[4 * i : 4 * i + 4] for i in range(len(requests))]
    slots = [
        int(blocks[pos // block_size]) * block_size + pos % block_size
        for blocks, (cached, new) in zip(tables, requests, strict=True)
        for pos in range(cached, cached + new)
    ]
    starts = [0]
    for _, new in requests:
        starts.append(starts[-1] + new)
    seq_lens = [cached + new for cached, new in requests]
    common = CommonAttentionMetadata(
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        num_computed_tokens=torch.tensor([c for c, _ in requests], dtype=torch.int32),
        block_table=torch.stack(tables).int(),
        slot_mapping=torch.tensor(slots),
        num_reqs=len(requests),
        num_actual_tokens=starts[-1],
        max_query_len=max(new for _, new in requests),
        max_seq_len=max(seq_lens),
    )
    builder = PagedAttentionMetadataBuilder(spec, ["attn"], torch.device("cpu"))
    return tables, starts, builder.build(common)
