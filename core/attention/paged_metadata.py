"""The paged-attention metadata: one step split into prefill chunks and one decode batch.

These are the public types the reference backend's kernel hooks receive
(`TorchRefImpl.forward_prefill` / `forward_decode`), so a kernel plugin that replaces one
hook reads the same fields the reference does. `PagedAttentionMetadataBuilder` builds
them once per step, on the host, for every layer of a KV-cache group.

Positions and blocks: a request's token at position p (0-based, over its whole context)
lives in block `block_ids[p // block_size]` at offset `p % block_size`, and its slot is
`block * block_size + offset`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from core.attention.interface import (
    AttentionBackend,
    AttentionMetadataBuilder,
    CommonAttentionMetadata,
)

__all__ = [
    "DecodeBatch",
    "PagedAttentionMetadata",
    "PagedAttentionMetadataBuilder",
    "PagedMetadataBackend",
    "PrefillChunk",
]


@dataclass
class PrefillChunk:
    """One request with more than one new token this step (a prompt or a chunk of one).

    Its new tokens are rows [start, end) of the step's query/key/value and have positions
    [seq_len - (end - start), seq_len); the positions before them are cached context
    (an earlier chunk or a prefix-cache hit), none when end - start == seq_len.
    """

    start: int
    end: int
    seq_len: int  # context length after this step, new tokens included
    block_ids: torch.Tensor  # [ceil(seq_len / block_size)] int64: the context's blocks in order


@dataclass
class DecodeBatch:
    """Every request with exactly one new token this step, attended together.

    A generation step and a one-token prefill chunk look alike here: row i's single query
    sits at position seq_lens[i] - 1 and sees the keys at positions [0, seq_lens[i]).
    """

    token_index: torch.Tensor  # [B] int64: the rows of the step's query/output
    # [B, num_blocks] int64, num_blocks = ceil(max(seq_lens) / block_size). Entries past a
    # row's own ceil(seq_lens[i] / block_size) blocks are padding: any block id, to be
    # ignored.
    block_table: torch.Tensor
    seq_lens: torch.Tensor  # [B] int64, contiguous: context length after this step
    # [1, num_blocks * block_size] int64: 0, 1, ... built once per step so every layer's
    # masks can compare against seq_lens without rebuilding it.
    key_positions: torch.Tensor
    # token_index as a slice when its rows are consecutive (the usual step: the scheduler
    # puts running requests first), so a backend can take a view where it would gather.
    token_rows: slice | None = None


@dataclass
class PagedAttentionMetadata:
    """What each layer of a KV-cache group receives for one step.

    `slot_mapping` covers every new token of the step's requests (the first
    len(slot_mapping) rows; rows after them belong to no request); every request is in
    exactly one of `prefills` (batch order) or `decode`.
    """

    slot_mapping: torch.Tensor  # [num_tokens] int64: the cache slot of each new token
    prefills: list[PrefillChunk]
    decode: DecodeBatch | None
    _key_rows: dict[int, torch.Tensor] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def key_rows(self, block_size: int) -> torch.Tensor:  # [num_tokens] int64
        """Each new token's K row in a layer's contiguous cache [num_blocks, 2, block_size,
        Hkv, D] seen as rows [num_blocks * 2 * block_size, Hkv, D]; its V row is block_size
        further. Computed once a step and shared by every layer (five small ops a layer
        otherwise: 18 of the 23 us one token's K/V write took)."""
        rows = self._key_rows.get(block_size)
        if rows is None:
            slots = self.slot_mapping
            rows = slots // block_size * (2 * block_size) + slots % block_size
            self._key_rows[block_size] = rows
        return rows


class PagedAttentionMetadataBuilder(AttentionMetadataBuilder):
    """The reference builder: CommonAttentionMetadata -> PagedAttentionMetadata."""

    def build(self, common: CommonAttentionMetadata) -> PagedAttentionMetadata:
        block_size = self.kv_cache_spec.block_size
        starts = common.query_start_loc.tolist()
        seq_lens = common.seq_lens.tolist()
        decode_rows = [i for i in range(common.num_reqs) if starts[i + 1] - starts[i] == 1]
        prefills = [
            PrefillChunk(
                starts[i],
                starts[i + 1],
                seq_lens[i],
                common.block_table[i, : -(-seq_lens[i] // block_size)].long(),
            )
            for i in range(common.num_reqs)
            if starts[i + 1] - starts[i] > 1
        ]
        return PagedAttentionMetadata(
            # Token rows past the last request's (padding for a piecewise graph) write
            # nothing and compute nothing.
            slot_mapping=common.slot_mapping[: starts[-1]],
            prefills=prefills,
            decode=self._decode_batch(common, decode_rows, block_size) if decode_rows else None,
        )

    def _decode_batch(
        self, common: CommonAttentionMetadata, rows: list[int], block_size: int
    ) -> DecodeBatch:
        index = torch.tensor(rows, device=common.seq_lens.device)
        seq_lens = common.seq_lens[index].long()
        num_blocks = -(-int(seq_lens.max()) // block_size)
        # Each decode row holds one token, so consecutive requests have consecutive rows.
        consecutive = rows[-1] - rows[0] == len(rows) - 1
        first = int(common.query_start_loc[rows[0]])
        return DecodeBatch(
            token_index=common.query_start_loc[index].long(),
            block_table=common.block_table[index, :num_blocks].long(),
            seq_lens=seq_lens,
            key_positions=torch.arange(num_blocks * block_size, device=index.device)[None, :],
            token_rows=slice(first, first + len(rows)) if consecutive else None,
        )


class PagedMetadataBackend(AttentionBackend):
    """A backend whose impl reads these metadata: the reference backends (`TorchRefBackend`,
    `TorchRefMLABackend`) and the kernel plugins' backends that subclass them."""

    @staticmethod
    def get_builder_cls() -> type[AttentionMetadataBuilder]:
        return PagedAttentionMetadataBuilder
