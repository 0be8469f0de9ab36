"""A deliberately broken attention backend: the kit must catch it and name the case.

It is the reference backend with one off-by-one in its decode block walk: the walk covers
ceil((seq_len - 1) / block_size) blocks, leaving out the newest token, so when that token
opened a new block (context = k * block_size + 1) the block is read as the null block.
Writes still go to the right slots: only the attention over that newest key is wrong.
"""

from __future__ import annotations

import dataclasses

import torch

from core.attention.backends.torch_ref import TorchRefBackend, TorchRefImpl
from core.attention.interface import AttentionImpl
from core.attention.paged_metadata import DecodeBatch


class EdgeBlindImpl(TorchRefImpl):
    def forward_decode(
        self, query: torch.Tensor, kv_cache: torch.Tensor, decode: DecodeBatch
    ) -> torch.Tensor:
        block_size = kv_cache.shape[2]
        walked = -(-(decode.seq_lens - 1) // block_size)  # the bug: should be seq_lens
        columns = torch.arange(decode.block_table.shape[1], device=query.device)
        table = decode.block_table.masked_fill(columns[None, :] >= walked[:, None], 0)
        return super().forward_decode(
            query, kv_cache, dataclasses.replace(decode, block_table=table)
        )


class EdgeBlindBackend(TorchRefBackend):
    name = "edge_blind"

    @staticmethod
    def get_impl_cls() -> type[AttentionImpl]:
        return EdgeBlindImpl
