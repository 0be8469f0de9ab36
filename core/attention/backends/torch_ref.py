"""The reference attention backend in pure PyTorch: paged KV cache, any device.

New queries attend to their request's cached context plus the new tokens up to
themselves, so one backend serves prefill, chunked prefill, prefix-cache hits and
decode. Decode rows (one new token each) are attended together in one batched
computation per layer — per-request kernel calls cost far more than the math on a CPU —
while prefill chunks, few per step, go one request at a time through SDPA.

An FP8 KV cache (--kv-cache-dtype fp8_e4m3 / fp8_e5m2) is written quantized with the
layer's scales and read back dequantized into the model's dtype; a prompt's own K/V are
attended as read back too, so a token's attention is the same whether its context was
computed in the step or read from the cache (chunks, prefix-cache hits, preemption).

It also serves encoder-only attention (BERT): every prompt token sees the whole prompt,
which the engine configuration puts in one step (no chunking, no prefix-cache hit:
core.pooling.runner). Its K/V still go through the paged cache, like a decoder's: the
step reads them back only for a one-token prompt, and nothing outlives the request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from core import batch_invariant
from core.attention.backends.mla_ref import TorchRefMLABackend
from core.attention.interface import AttentionCapabilities, AttentionImpl, AttentionType
from core.attention.kv_cache_dtype import FP8_KV_CACHE_DTYPES, dequantize_kv, quantize_kv
from core.attention.paged_metadata import (
    DecodeBatch,
    PagedAttentionMetadata,
    PagedMetadataBackend,
    PrefillChunk,
)

if TYPE_CHECKING:
    from core.attention.layer import Attention

__all__ = ["TorchRefBackend", "TorchRefImpl", "bind_reference_backend", "gather_pages"]


class TorchRefImpl(AttentionImpl):
    """The reference kernel, and the class a kernel plugin subclasses to replace one half.

    `forward` stores the step's K/V in the cache at `slot_mapping`, then calls
    `forward_prefill` once per prefill chunk and `forward_decode` once for the decode
    batch, and places their rows in the output. The hooks are the kernel seam: a subclass
    overrides either one (cpu_kernels replaces `forward_decode` with a C++ kernel) and
    inherits the rest; its backend subclasses `TorchRefBackend`, keeping the reference's
    metadata builder and KV layout.

    What both hooks may rely on:
    - KV layout (`TorchRefBackend.get_kv_cache_shape`): `kv_cache` is
      [num_blocks, 2, block_size, num_kv_heads, head_size], index 0 of dimension 1 the
      keys and 1 the values, in the model's dtype, or in an FP8 dtype when the impl has
      `kv_scales` (read it through `read_pages`, which dequantizes). Only the head_size
      dimension is guaranteed contiguous: a block-outermost KV-cache layout interleaves
      several layers' pages, so consecutive blocks may be further apart than one page.
    - The step's K/V are already in the cache when a hook runs; hooks read the cache
      and write nothing but their return value.
    - GQA: query head h reads KV head h // (num_heads // num_kv_heads).
    - Causality and window: the query at position p sees the keys at positions
      [max(0, p - sliding_window + 1), p] (all of [0, p] when `sliding_window` is None).
      Encoder-only layers (`attn_type` ENCODER_ONLY) see every key of their prompt, which
      is always wholly in the step (a prefill chunk from position 0, or one decode row).
    - `scale` multiplies q.k before the softmax; the result is in the query's dtype.
    - With `logits_soft_cap` c set, each score s = scale * q.k becomes c * tanh(s / c)
      before masking and the softmax (Gemma 2's attention).

    In batch-invariant mode (core.batch_invariant) a decoder layer's rows go to
    `forward_rows` instead of the hooks.
    """

    def forward(
        self,
        query: torch.Tensor,  # [T, Hq, D]
        key: torch.Tensor,  # [T, Hkv, D]
        value: torch.Tensor,  # [T, Hkv, D]
        kv_cache: torch.Tensor,  # [num_blocks, 2, block_size, Hkv, D]
        attn_metadata: PagedAttentionMetadata,
    ) -> torch.Tensor:  # [T, Hq, D]
        num_tokens = len(attn_metadata.slot_mapping)
        key, value = self._store_kv(kv_cache, key[:num_tokens], value[:num_tokens], attn_metadata)
        if batch_invariant.enabled() and self.attn_type is AttentionType.DECODER:
            return self._forward_each_row(query, kv_cache, attn_metadata)
        decode = attn_metadata.decode
        if (
            not attn_metadata.prefills
            and decode is not None
            and decode.token_rows == slice(0, len(query))
        ):
            return self.forward_decode(query, kv_cache, decode)  # a step of decode rows alone
        output = torch.empty_like(query)
        for chunk in attn_metadata.prefills:
            rows = slice(chunk.start, chunk.end)
            output[rows] = self.forward_prefill(
                query[rows], key[rows], value[rows], kv_cache, chunk
            )
        if decode is None:
            return output
        # A slice views the rows where the index tensor would gather and scatter them.
        rows = decode.token_index if decode.token_rows is None else decode.token_rows
        output[rows] = self.forward_decode(query[rows], kv_cache, decode)
        return output

    def forward_prefill(
        self,
        query: torch.Tensor,  # [q_len, Hq, D]
        key: torch.Tensor,  # [q_len, Hkv, D]
        value: torch.Tensor,  # [q_len, Hkv, D]
        kv_cache: torch.Tensor,  # [num_blocks, 2, block_size, Hkv, D]
        chunk: PrefillChunk,
    ) -> torch.Tensor:  # [q_len, Hq, D]
        """Attention of one request's new tokens (q_len = chunk.end - chunk.start > 1).

        `query`, `key` and `value` are the chunk's own rows (views into the step's
        tensors), at positions [chunk.seq_len - q_len, chunk.seq_len). Keys before those
        are read from `kv_cache` through `chunk.block_ids`; the chunk's own keys are both
        in `key`/`value` and in the cache (an FP8 cache's values, dequantized, in both).
        """
        q_len = query.shape[0]
        cacheless = q_len == chunk.seq_len
        if self.attn_type is AttentionType.ENCODER_ONLY:
            return self._attend_whole_prompt(query, key, value, cacheless)
        if cacheless:  # the new K/V are the whole context
            k, v = key, value
        else:
            k, v = self.read_pages(kv_cache, chunk.block_ids, query.dtype)  # [>= seq_len, Hkv, D]
            k, v = k[: chunk.seq_len], v[: chunk.seq_len]
        # A plain causal square lets SDPA skip the masked half instead of reading a mask;
        # the soft-capped path takes no is_causal, so it always gets the mask.
        mask = None
        if not cacheless or self.sliding_window is not None or self.logits_soft_cap is not None:
            device = query.device
            q_pos = torch.arange(chunk.seq_len - q_len, chunk.seq_len, device=device)[:, None]
            k_pos = torch.arange(chunk.seq_len, device=device)[None, :]
            mask = k_pos <= q_pos  # [q_len, seq_len]
            if self.sliding_window is not None:
                mask &= q_pos - k_pos < self.sliding_window
        # 4-D inputs: on a CPU, SDPA's flash kernel takes only those (3-D ones fall back to
        # the unfused math path, ~5x slower on long prompts).
        out = self._attend(
            query.transpose(0, 1)[None],  # [1, Hq, q_len, D]
            k.transpose(0, 1)[None],  # [1, Hkv, seq_len, D]
            v.transpose(0, 1)[None],
            mask,
            is_causal=mask is None,
        )
        return out[0].transpose(0, 1)

    def _attend_whole_prompt(
        self,
        query: torch.Tensor,  # [q_len, Hq, D]
        key: torch.Tensor,  # [q_len, Hkv, D]
        value: torch.Tensor,  # [q_len, Hkv, D]
        cacheless: bool,
    ) -> torch.Tensor:  # [q_len, Hq, D]
        """Bidirectional attention over the prompt, all of it in this chunk."""
        if not cacheless:
            raise ValueError(
                "encoder-only attention needs the whole prompt in one step; chunked "
                "prefill and prefix caching must be off (--runner pooling turns them off)"
            )
        out = self._attend(
            query.transpose(0, 1)[None],  # [1, Hq, q_len, D]
            key.transpose(0, 1)[None],  # [1, Hkv, q_len, D]
            value.transpose(0, 1)[None],
            mask=None,
        )
        return out[0].transpose(0, 1)

    def forward_decode(
        self,
        query: torch.Tensor,  # [B, Hq, D]
        kv_cache: torch.Tensor,  # [num_blocks, 2, block_size, Hkv, D]
        decode: DecodeBatch,
    ) -> torch.Tensor:  # [B, Hq, D]
        """Attention of the decode batch: row i's one query over its cached context.

        `query` holds the batch's rows in `decode` order (row i is step row
        decode.token_index[i]); all of each row's keys, its new one included, are read
        from `kv_cache` through `decode.block_table[i]` and `decode.seq_lens[i]`.
        """
        k, v = self.read_pages(kv_cache, decode.block_table, query.dtype)  # [B, L, Hkv, D]
        k, v = k.transpose(1, 2), v.transpose(1, 2)  # [B, Hkv, L, D]
        seq_lens = decode.seq_lens[:, None]  # [B, 1]
        # Keys past each context (padding, other requests' blocks) do not exist.
        visible = decode.key_positions < seq_lens  # [B, L]
        if self.sliding_window is not None:
            visible &= decode.key_positions >= seq_lens - self.sliding_window
        out = self._attend(query[:, :, None, :], k, v, visible[:, None, None, :])  # [B, Hq, 1, D]
        return out[:, :, 0]

    def _forward_each_row(
        self,
        query: torch.Tensor,  # [T, Hq, D]
        kv_cache: torch.Tensor,
        attn_metadata: PagedAttentionMetadata,
    ) -> torch.Tensor:  # [T, Hq, D]
        """The step's rows through `forward_rows`: a prefill chunk's row at position p as
        a decode row whose context ends at p."""
        output = torch.empty_like(query)
        for chunk in attn_metadata.prefills:
            q_len = chunk.end - chunk.start
            seq_lens = torch.arange(chunk.seq_len - q_len + 1, chunk.seq_len + 1)
            table = chunk.block_ids[None].expand(q_len, -1)  # the chunk's blocks, every row
            rows = slice(chunk.start, chunk.end)
            output[rows] = self.forward_rows(query[rows], kv_cache, table, seq_lens)
        decode = attn_metadata.decode
        if decode is not None:
            rows = decode.token_index if decode.token_rows is None else decode.token_rows
            output[rows] = self.forward_rows(
                query[rows], kv_cache, decode.block_table, decode.seq_lens
            )
        return output

    def forward_rows(
        self,
        query: torch.Tensor,  # [R, Hq, D]
        kv_cache: torch.Tensor,  # [num_blocks, 2, block_size, Hkv, D]
        block_table: torch.Tensor,  # [R, >= the blocks of each row's context]
        seq_lens: torch.Tensor,  # [R]: row i attends to the keys at positions < seq_lens[i]
    ) -> torch.Tensor:  # [R, Hq, D]
        """Batch-invariant mode's attention (core.batch_invariant), where `forward` sends
        every row of a decoder layer's step instead of the two hooks: row i's one query over
        the keys at positions [max(0, seq_lens[i] - sliding_window), seq_lens[i]), read
        through block_table[i]. Its result for a row must not depend on the other rows nor
        on how the row came (a decode row, or one of a prefill chunk, at any position):
        bit for bit. Here each row goes alone, over exactly its visible keys gathered
        afresh, through one SDPA call whose shapes depend on its context length alone. A
        kernel plugin overriding this keeps the guarantee (cpu_paged: its decode kernel),
        and its backend then inherits `batch_invariant` rightly; one overriding only the
        hooks does too, as the hooks do not run in the mode."""
        block_size = kv_cache.shape[2]
        out = torch.empty_like(query)
        for i, seq_len in enumerate(seq_lens.tolist()):
            start = 0 if self.sliding_window is None else max(0, seq_len - self.sliding_window)
            blocks = block_table[i, : -(-seq_len // block_size)]
            k, v = self.read_pages(kv_cache, blocks, query.dtype)  # [>= seq_len, Hkv, D]
            row = self._attend(
                query[i].clone()[None, :, None, :],  # [1, Hq, 1, D]
                k[start:seq_len].transpose(0, 1)[None],  # [1, Hkv, visible, D]
                v[start:seq_len].transpose(0, 1)[None],
                mask=None,
            )
            out[i] = row[0, :, 0]
        return out

    def _store_kv(
        self,
        kv_cache: torch.Tensor,  # [num_blocks, 2, block_size, Hkv, D]
        key: torch.Tensor,  # [T, Hkv, D]
        value: torch.Tensor,  # [T, Hkv, D]
        attn_metadata: PagedAttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # [T, Hkv, D] each
        """Write the step's K/V at their slots; return them as the cache gives them back
        (for an FP8 cache: quantized with `kv_scales`, then dequantized)."""
        if self.kv_scales is None:
            _write_kv(kv_cache, key, value, attn_metadata)
            return key, value
        k_scale, v_scale = self.kv_scales.k_scale, self.kv_scales.v_scale
        stored_k = quantize_kv(key, k_scale, kv_cache.dtype)
        stored_v = quantize_kv(value, v_scale, kv_cache.dtype)
        _write_kv(kv_cache, stored_k, stored_v, attn_metadata)
        dtype = key.dtype
        return dequantize_kv(stored_k, k_scale, dtype), dequantize_kv(stored_v, v_scale, dtype)

    def read_pages(
        self, kv_cache: torch.Tensor, block_ids: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:  # [..., n * block_size, Hkv, D] each
        """`gather_pages` in `dtype` (the query's): an FP8 cache's pages dequantized with
        `kv_scales`, others as stored."""
        k, v = gather_pages(kv_cache, block_ids)
        if self.kv_scales is None:
            return k, v
        scales = self.kv_scales
        return dequantize_kv(k, scales.k_scale, dtype), dequantize_kv(v, scales.v_scale, dtype)

    def _attend(
        self,
        query: torch.Tensor,  # [B, Hq, Q, D]
        key: torch.Tensor,  # [B, Hkv, L, D]
        value: torch.Tensor,  # [B, Hkv, L, D]
        mask: torch.Tensor | None,  # bool, broadcast to [B, Hq, Q, L]: True where visible
        is_causal: bool = False,  # mask None: causal square, else every key visible
    ) -> torch.Tensor:  # [B, Hq, Q, D]
        """SDPA, or, with a soft cap (which SDPA cannot apply), the same math spelled out;
        a soft-capping caller passes its mask, never is_causal."""
        if self.logits_soft_cap is None:
            return F.scaled_dot_product_attention(
                query, key, value, attn_mask=mask, is_causal=is_causal, scale=self.scale,
                enable_gqa=self.num_heads != self.num_kv_heads,
            )  # fmt: skip
        group = self.num_heads // self.num_kv_heads  # query head h reads KV head h // group
        key = key.repeat_interleave(group, dim=1)  # [B, Hq, L, D]
        value = value.repeat_interleave(group, dim=1)
        cap = self.logits_soft_cap
        scores = torch.tanh(query @ key.transpose(-1, -2) * self.scale / cap) * cap  # [B, Hq, Q, L]
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        # The softmax in float32, as transformers' eager attention computes it.
        weights = scores.softmax(dim=-1, dtype=torch.float32).to(query.dtype)
        return weights @ value


def gather_pages(
    kv_cache: torch.Tensor, block_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of blocks [..., n] as [..., n * block_size, Hkv, D] each (public: kernel
    plugins that hand contiguous K/V to a dense kernel gather them the same way).

    index_select copies whole pages row by row (about 3x faster than advanced indexing on
    a CPU), and gathering K and V separately keeps each result contiguous, so the flatten
    is a view rather than a second copy.
    """
    flat = block_ids.flatten()
    shape = (*block_ids.shape[:-1], -1, *kv_cache.shape[-2:])
    k = kv_cache[:, 0].index_select(0, flat).view(shape)
    v = kv_cache[:, 1].index_select(0, flat).view(shape)
    return k, v


def _write_kv(
    kv_cache: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_metadata: PagedAttentionMetadata,
) -> None:
    """Store the step's K/V, in the cache's dtype, at their slots (slot = block *
    block_size + offset)."""
    num_blocks, _, block_size, num_kv_heads, head_size = kv_cache.shape
    if kv_cache.is_contiguous():
        # index_copy_ on a flat view is far faster than advanced-index assignment.
        rows = _copyable(kv_cache).view(num_blocks * 2 * block_size, num_kv_heads, head_size)
        key_rows = attn_metadata.key_rows(block_size)
        rows.index_copy_(0, key_rows, _copyable(key))
        rows.index_copy_(0, key_rows + block_size, _copyable(value))
    else:  # a block-outermost layout interleaves layers: pages are not adjacent
        slots = attn_metadata.slot_mapping
        blocks, offsets = slots // block_size, slots % block_size
        kv_cache[blocks, 0, offsets] = key
        kv_cache[blocks, 1, offsets] = value


def _copyable(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor`, or for one-byte values (FP8) their bytes: index_copy_ has no CPU kernel
    for float8 dtypes."""
    return tensor.view(torch.uint8) if tensor.dtype.itemsize == 1 else tensor


class TorchRefBackend(PagedMetadataBackend):
    """The reference backend; a kernel plugin's backend subclasses it to keep its
    metadata builder and KV layout while `get_impl_cls` returns a TorchRefImpl subclass."""

    name = "torch_ref"
    capabilities = AttentionCapabilities(
        dtypes=frozenset({torch.float32, torch.float16, torch.bfloat16}),
        kv_cache_dtypes=frozenset({"auto", *FP8_KV_CACHE_DTYPES}),
        attention_types=frozenset({AttentionType.DECODER, AttentionType.ENCODER_ONLY}),
        logits_soft_cap=True,
        batch_invariant=True,  # forward_rows
    )
    mla_backend = TorchRefMLABackend  # multi-head latent attention layers

    @staticmethod
    def get_impl_cls() -> type[AttentionImpl]:
        return TorchRefImpl

    @staticmethod
    def get_kv_cache_shape(
        num_blocks: int, block_size: int, num_kv_heads: int, head_size: int
    ) -> tuple[int, ...]:
        """[num_blocks, 2, block_size, num_kv_heads, head_size]: K then V of each block.

        The layout `TorchRefImpl`'s hooks read. K and V of one block sit side by side, so a
        block's page is contiguous and the KVCacheTensor layouts can place whole pages.
        """
        return (num_blocks, 2, block_size, num_kv_heads, head_size)


def bind_reference_backend(layer: Attention, num_blocks: int, block_size: int) -> None:
    """Bind the reference backend to `layer` (its MLA variant for a multi-head latent
    attention layer) with a zeroed KV cache of `num_blocks` blocks: how model checks run
    a model outside an engine (the conformance kit, calibration)."""
    backend = TorchRefBackend.mla_backend if layer.use_mla else TorchRefBackend
    layer.bind_backend(backend)
    shape = backend.get_kv_cache_shape(num_blocks, block_size, layer.num_kv_heads, layer.head_size)
    layer.kv_cache = torch.zeros(shape)
