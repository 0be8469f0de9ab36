"""Attention backends declaring batch-invariant mode, for the kit's invariance check.

`RowwiseBackend` attends every query row, decode or prefill, alone: one SDPA call per row
over its keys [0, p] read back from the paged cache, so a row's output cannot depend on
its batch; it conforms. `StepSizedBackend` does the same, then moves every output by a
last bit per extra token in the step, as a kernel that picks its blocking from the
step's size would: the kit must catch it. Neither subclasses the reference's impl, so
neither follows what torch_ref does in the mode. `UndeclaredBackend` is the conforming
one without the declaration: the kit skips it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import torch
import torch.nn.functional as F

from core.attention.backends.torch_ref import TorchRefBackend, gather_pages
from core.attention.interface import AttentionCapabilities, AttentionImpl
from core.attention.paged_metadata import PagedAttentionMetadata


class RowwiseImpl(AttentionImpl):
    def forward(
        self,
        query: torch.Tensor,  # [T, Hq, D]
        key: torch.Tensor,  # [T, Hkv, D]
        value: torch.Tensor,  # [T, Hkv, D]
        kv_cache: torch.Tensor,  # [num_blocks, 2, block_size, Hkv, D]
        attn_metadata: PagedAttentionMetadata,
    ) -> torch.Tensor:  # [T, Hq, D]
        slots = attn_metadata.slot_mapping
        blocks, offsets = slots // kv_cache.shape[2], slots % kv_cache.shape[2]
        kv_cache[blocks, 0, offsets] = key[: len(slots)]
        kv_cache[blocks, 1, offsets] = value[: len(slots)]
        output = torch.zeros_like(query)
        for row, block_ids, seq_len in _rows(attn_metadata):
            output[row] = self._attend_row(query[row], kv_cache, block_ids, seq_len)
        return output

    def _attend_row(
        self, query: torch.Tensor, kv_cache: torch.Tensor, block_ids: torch.Tensor, seq_len: int
    ) -> torch.Tensor:  # query, result: [Hq, D]
        k, v = gather_pages(kv_cache, block_ids)  # [n * block_size, Hkv, D]
        k, v = (t[:seq_len].transpose(0, 1).contiguous()[None] for t in (k, v))  # [1, Hkv, L, D]
        out = F.scaled_dot_product_attention(
            query[None, :, None], k, v, scale=self.scale, enable_gqa=True
        )  # [1, Hq, 1, D]
        return out[0, :, 0]


def _rows(metadata: PagedAttentionMetadata) -> Iterator[tuple[int, torch.Tensor, int]]:
    """(step row, the request's blocks, context length up to and including the row)."""
    for chunk in metadata.prefills:
        for row in range(chunk.start, chunk.end):
            yield row, chunk.block_ids, chunk.seq_len - (chunk.end - row) + 1
    decode = metadata.decode
    if decode is not None:
        for i, (row, seq_len) in enumerate(
            zip(decode.token_index.tolist(), decode.seq_lens.tolist(), strict=True)
        ):
            yield row, decode.block_table[i], seq_len


class StepSizedImpl(RowwiseImpl):
    def forward(self, query, key, value, kv_cache, attn_metadata) -> torch.Tensor:
        output = super().forward(query, key, value, kv_cache, attn_metadata)
        num_tokens = len(attn_metadata.slot_mapping)
        return output * (1 + torch.finfo(output.dtype).eps * (num_tokens - 1))


class RowwiseBackend(TorchRefBackend):
    """The reference's metadata and KV layout; its own per-row kernel."""

    name = "rowwise"
    capabilities = AttentionCapabilities(
        dtypes=frozenset({torch.float32, torch.bfloat16}), batch_invariant=True
    )

    @staticmethod
    def get_impl_cls() -> type[AttentionImpl]:
        return RowwiseImpl


class StepSizedBackend(RowwiseBackend):
    name = "step_sized"

    @staticmethod
    def get_impl_cls() -> type[AttentionImpl]:
        return StepSizedImpl


class UndeclaredBackend(RowwiseBackend):
    name = "undeclared"
    capabilities = replace(RowwiseBackend.capabilities, batch_invariant=False)
