"""Triton kernels of paged attention: the KV write, one varlen attention for prefill
chunks and decodes together, and a decode split over the KV length for long contexts.

KV cache: [num_blocks, 2, block_size, Hkv, D] (index 0 of dimension 1 the keys, 1 the
values), read through its strides: a block-outermost layout interleaves several layers'
pages, so consecutive blocks may be further apart than one page. A request's key at
position p lives in block block_table[req, p // block_size] at offset p % block_size.

Attention of one program: a tile of BLOCK_M rows, each a (new token, query head) pair
whose heads share one KV head (GQA grouping: the group's heads read each K/V tile once),
walks the keys it may see in tiles of BLOCK_N positions, gathering each tile's pages
through the block table, with an online softmax in float32 (scores in log2 units so the
exponentials are exp2). Query position p sees keys [max(0, p - window + 1), p].

Launch configuration (grids, tile sizes, which path) depends only on the batch's host
integers num_reqs, num_actual_tokens, max_query_len and max_seq_len, and stays correct
when the last two are upper bounds; everything else is read from device memory, so a
captured device graph replays any batch of the same padded shape.

This module imports triton at the top: import it only where triton is available. Under
`TRITON_INTERPRET=1` (set before this module is imported) the kernels run on CPU
tensors, which is how the tests check them; the interpreter cannot multiply bfloat16
tiles, so there the bfloat16 tiles are converted to float32 before each `tl.dot`. The
kernels call only `triton.language` builtins, no `@triton.jit` library helpers such as
`tl.zeros`, `tl.cdiv`, `tl.max` or `tl.sum`: those are decorated when triton is imported,
so a process that imported triton before setting TRITON_INTERPRET could not interpret
them. Row maxima and sums are therefore the builtin `tl.reduce` with the combine functions
`tl.max` / `tl.sum` use themselves (`tl.standard._elementwise_max` / `_sum_combine`),
which the interpreter recognizes and runs as numpy reductions. The kernels and their
launchers share this one module (past the usual size) because a test's interpreted copy
must hold every kernel a launcher calls: a helper imported from another module would stay
compiled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from core_attn_flash.metadata import FlashAttentionMetadata, SplitKVPartials

__all__ = [
    "NUM_SPLITS",
    "partials_shape",
    "reshape_and_cache",
    "split_kv_decode",
    "unified_attention",
]

NUM_SPLITS = 16  # KV-length splits of the split-KV decode (a power of two)
_INTERPRETED = triton.knobs.runtime.interpret  # as `@triton.jit` saw it below
_LOG2E = math.log2(math.e)
_MIN_TILE = 16  # tl.dot's smallest tile side
_COPY_TILE = 4096  # elements of K (and of V) one reshape_and_cache program moves


@triton.jit
def _reshape_and_cache_kernel(
    key_ptr,  # [T, Hkv, D]
    value_ptr,  # [T, Hkv, D]
    kv_cache_ptr,  # [num_blocks, 2, block_size, Hkv, D]
    slot_mapping_ptr,  # int64 [T]
    num_tokens,
    stride_kt,
    stride_kh,
    stride_kd,
    stride_vt,
    stride_vh,
    stride_vd,
    stride_cb,
    stride_ckv,
    stride_cs,
    stride_ch,
    stride_cd,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_T: tl.constexpr,  # tokens per program
    BLOCK_D: tl.constexpr,
    BLOCK_HD: tl.constexpr,  # next_power_of_2(Hkv) * BLOCK_D: one column per (head, dim)
):
    tokens = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    slots = tl.load(slot_mapping_ptr + tokens, mask=tokens < num_tokens, other=-1)
    columns = tl.arange(0, BLOCK_HD)
    heads = columns // BLOCK_D
    dims = columns % BLOCK_D
    # Slot -1 marks a padding row: nothing to store.
    mask = (slots >= 0)[:, None] & ((heads < NUM_KV_HEADS) & (dims < HEAD_SIZE))[None, :]
    page_rows = (slots // BLOCK_SIZE) * stride_cb + (slots % BLOCK_SIZE) * stride_cs
    cache = kv_cache_ptr + page_rows[:, None] + (heads * stride_ch + dims * stride_cd)[None, :]
    rows = tokens[:, None]
    key = tl.load(
        key_ptr + rows * stride_kt + (heads * stride_kh + dims * stride_kd)[None, :], mask=mask
    )
    tl.store(cache, key, mask=mask)
    value = tl.load(
        value_ptr + rows * stride_vt + (heads * stride_vh + dims * stride_vd)[None, :], mask=mask
    )
    tl.store(cache + stride_ckv, value, mask=mask)


@triton.jit
def _attend(
    acc,  # [BLOCK_M, BLOCK_D] float32: unnormalized output so far
    m_i,  # [BLOCK_M] float32: running max score (log2 units), -inf before any key
    l_i,  # [BLOCK_M] float32: running softmax denominator
    q,  # [BLOCK_M, BLOCK_D]
    q_pos,  # [BLOCK_M] int32: each row's position
    k_lo,  # first key position to fold in
    k_hi,  # one past the last one
    key_cache_ptr,  # the K half of the KV cache, kv head applied
    value_cache_ptr,  # the V half, kv head applied
    block_table_ptr,  # the request's row of the block table
    qk_scale,  # scale * log2(e)
    window,
    stride_cb,
    stride_cs,
    stride_cd,
    HEAD_SIZE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """Fold keys [k_lo, k_hi) into the online softmax of the rows (causal, windowed).

    The walk starts at the tile edge below k_lo; keys outside [k_lo, k_hi) are not even
    loaded: below a window the pages may be gone (the null block, whose contents are
    undefined, and 0 x NaN in P @ V would poison the row)."""
    dims = tl.arange(0, BLOCK_D)
    dim_in = dims < HEAD_SIZE
    for start in range(k_lo // BLOCK_N * BLOCK_N, k_hi, BLOCK_N):
        k_pos = start + tl.arange(0, BLOCK_N)  # [BLOCK_N]
        k_in = (k_pos >= k_lo) & (k_pos < k_hi)
        block = tl.load(block_table_ptr + k_pos // BLOCK_SIZE, mask=k_in, other=0)
        rows = block.to(tl.int64) * stride_cb + (k_pos % BLOCK_SIZE) * stride_cs  # [BLOCK_N]
        k = tl.load(
            key_cache_ptr + rows[None, :] + dims[:, None] * stride_cd,
            mask=dim_in[:, None] & k_in[None, :],
            other=0.0,
        )  # [BLOCK_D, BLOCK_N]: K^T
        v = tl.load(
            value_cache_ptr + rows[:, None] + dims[None, :] * stride_cd,
            mask=k_in[:, None] & dim_in[None, :],
            other=0.0,
        )  # [BLOCK_N, BLOCK_D]
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, k, input_precision="ieee") * qk_scale  # [BLOCK_M, BLOCK_N]
        visible = (k_pos[None, :] <= q_pos[:, None]) & k_in[None, :]
        if USE_WINDOW:
            visible = visible & (q_pos[:, None] - k_pos[None, :] < window)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.reduce(s, 1, tl.standard._elementwise_max))
        # A row that has seen no visible key yet keeps max -inf; 0 keeps exp2 off -inf - -inf.
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_ref[:, None])
        alpha = tl.exp2(m_i - m_ref)
        l_i = l_i * alpha + tl.reduce(p, 1, tl.standard._sum_combine)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _find_request(query_start_loc_ptr, num_reqs, q_block, BLOCK_Q: tl.constexpr):
    """The request that owns q-block `q_block`.

    Request i owns q-blocks [S_i, S_i + ceil(q_len_i / BLOCK_Q)) with
    S_i = query_start_loc[i] // BLOCK_Q + i: S_{i+1} - S_i >= floor(q_len_i / BLOCK_Q) + 1,
    so the ranges never overlap (a few q-blocks between them own nothing), S_0 = 0, and
    the owner is the last i with S_i <= q_block: a binary search over the requests.
    """
    lo = q_block * 0
    hi = lo + num_reqs
    while lo < hi:
        mid = (lo + hi) // 2
        right = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid <= q_block
        lo = tl.where(right, mid + 1, lo)
        hi = tl.where(right, hi, mid)
    return lo - 1


@triton.jit
def _unified_attention_kernel(
    out_ptr,  # [T, Hq, D]
    q_ptr,  # [T, Hq, D]
    kv_cache_ptr,  # [num_blocks, 2, block_size, Hkv, D]
    block_table_ptr,  # int32 [num_reqs, max_num_blocks]
    query_start_loc_ptr,  # int32 [num_reqs + 1]
    seq_lens_ptr,  # int32 [num_reqs]
    num_reqs,
    qk_scale,
    window,
    stride_ot,
    stride_oh,
    stride_od,
    stride_qt,
    stride_qh,
    stride_qd,
    stride_bt,
    stride_cb,
    stride_ckv,
    stride_cs,
    stride_ch,
    stride_cd,
    HEAD_SIZE: tl.constexpr,
    GROUP: tl.constexpr,  # query heads per KV head
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,  # new tokens per program: BLOCK_M // GROUP
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """Program (q-block, kv head): BLOCK_Q new tokens of one request x the KV head's GROUP
    query heads, over the request's cached context and its new tokens up to each one."""
    q_block = tl.program_id(0)
    kv_head = tl.program_id(1)
    req = _find_request(query_start_loc_ptr, num_reqs, q_block, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - q_start
    first = (q_block - q_start // BLOCK_Q - req) * BLOCK_Q  # the tile's first new token
    if first >= q_len:  # past the request's tokens (a padding request has none)
        return
    seq_len = tl.load(seq_lens_ptr + req)
    first_pos = seq_len - q_len + first

    rows = tl.arange(0, BLOCK_M)
    token = first + rows // GROUP  # [BLOCK_M]: the row's new token within the request
    head = kv_head * GROUP + rows % GROUP
    row_in = (rows < BLOCK_Q * GROUP) & (token < q_len)
    dims = tl.arange(0, BLOCK_D)
    io_mask = row_in[:, None] & (dims < HEAD_SIZE)[None, :]
    q_row = (q_start + token).to(tl.int64)
    q = tl.load(
        q_ptr + q_row[:, None] * stride_qt + head[:, None] * stride_qh + dims[None, :] * stride_qd,
        mask=io_mask,
        other=0.0,
    )  # [BLOCK_M, BLOCK_D]
    if UPCAST:
        q = q.to(tl.float32)

    k_hi = tl.minimum(first_pos + BLOCK_Q, seq_len)  # the last row's position + 1
    k_lo = k_hi * 0
    if USE_WINDOW:  # the first row's window start: no row sees further back
        k_lo = tl.maximum(first_pos - window + 1, 0)
    acc = tl.full((BLOCK_M, BLOCK_D), 0.0, tl.float32)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.full((BLOCK_M,), 0.0, tl.float32)
    key_cache = kv_cache_ptr + kv_head * stride_ch
    acc, m_i, l_i = _attend(
        acc,
        m_i,
        l_i,
        q,
        first_pos + rows // GROUP,
        k_lo,
        k_hi,
        key_cache,
        key_cache + stride_ckv,
        block_table_ptr + req.to(tl.int64) * stride_bt,
        qk_scale,
        window,
        stride_cb,
        stride_cs,
        stride_cd,
        HEAD_SIZE,
        BLOCK_SIZE,
        BLOCK_N,
        BLOCK_D,
        USE_WINDOW,
        UPCAST,
    )
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    out_ptrs = out_ptr + q_row[:, None] * stride_ot + head[:, None] * stride_oh
    tl.store(out_ptrs + dims[None, :] * stride_od, out.to(out_ptr.dtype.element_ty), mask=io_mask)


@triton.jit
def _split_kv_decode_kernel(
    acc_ptr,  # float32 [R, Hq, NUM_SPLITS, BLOCK_D]
    maxes_ptr,  # float32 [R, Hq, NUM_SPLITS]
    sums_ptr,  # float32 [R, Hq, NUM_SPLITS], strides of maxes
    q_ptr,  # [T, Hq, D]
    kv_cache_ptr,  # [num_blocks, 2, block_size, Hkv, D]
    block_table_ptr,  # int32 [num_reqs, max_num_blocks]
    query_start_loc_ptr,  # int32 [num_reqs + 1]
    seq_lens_ptr,  # int32 [num_reqs]
    qk_scale,
    window,
    stride_qt,
    stride_qh,
    stride_qd,
    stride_bt,
    stride_cb,
    stride_ckv,
    stride_cs,
    stride_ch,
    stride_cd,
    stride_ar,
    stride_ah,
    stride_as,
    stride_mr,
    stride_mh,
    stride_ms,
    HEAD_SIZE: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """Program (request, kv head, split): the request's one new token x the KV head's
    GROUP query heads, over the split-th of NUM_SPLITS tile-aligned stretches of the keys
    it sees. The stretches depend on the request's own seq_len only, so the result does
    not depend on the rest of the batch or on max_seq_len."""
    req = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + req)
    if tl.load(query_start_loc_ptr + req + 1) == q_start:  # a padding request
        return
    seq_len = tl.load(seq_lens_ptr + req)
    first_key = seq_len * 0
    if USE_WINDOW:
        first_key = tl.maximum(seq_len - window, 0)
    edge = first_key // BLOCK_N * BLOCK_N  # the stretches are whole tiles from here
    stretch = ((seq_len - edge + BLOCK_N - 1) // BLOCK_N + NUM_SPLITS - 1) // NUM_SPLITS * BLOCK_N
    k_lo = tl.maximum(edge + split * stretch, first_key)
    k_hi = tl.minimum(edge + (split + 1) * stretch, seq_len)

    rows = tl.arange(0, BLOCK_M)
    head = kv_head * GROUP + rows
    row_in = rows < GROUP
    dims = tl.arange(0, BLOCK_D)
    q = tl.load(
        q_ptr
        + q_start.to(tl.int64) * stride_qt
        + head[:, None] * stride_qh
        + dims[None, :] * stride_qd,
        mask=row_in[:, None] & (dims < HEAD_SIZE)[None, :],
        other=0.0,
    )  # [BLOCK_M, BLOCK_D]
    if UPCAST:
        q = q.to(tl.float32)
    acc = tl.full((BLOCK_M, BLOCK_D), 0.0, tl.float32)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.full((BLOCK_M,), 0.0, tl.float32)
    key_cache = kv_cache_ptr + kv_head * stride_ch
    acc, m_i, l_i = _attend(
        acc,
        m_i,
        l_i,
        q,
        rows * 0 + seq_len - 1,
        k_lo,
        k_hi,
        key_cache,
        key_cache + stride_ckv,
        block_table_ptr + req.to(tl.int64) * stride_bt,
        qk_scale,
        window,
        stride_cb,
        stride_cs,
        stride_cd,
        HEAD_SIZE,
        BLOCK_SIZE,
        BLOCK_N,
        BLOCK_D,
        USE_WINDOW,
        UPCAST,
    )
    part = req.to(tl.int64) * stride_mr + head * stride_mh + split * stride_ms  # [BLOCK_M]
    tl.store(maxes_ptr + part, m_i, mask=row_in)
    tl.store(sums_ptr + part, l_i, mask=row_in)
    acc_rows = acc_ptr + req.to(tl.int64) * stride_ar + head * stride_ah + split * stride_as
    tl.store(acc_rows[:, None] + dims[None, :], acc, mask=row_in[:, None])


@triton.jit
def _split_kv_reduce_kernel(
    out_ptr,  # [T, Hq, D]
    acc_ptr,  # float32 [R, Hq, NUM_SPLITS, BLOCK_D]
    maxes_ptr,  # float32 [R, Hq, NUM_SPLITS]
    sums_ptr,  # float32 [R, Hq, NUM_SPLITS], strides of maxes
    query_start_loc_ptr,  # int32 [num_reqs + 1]
    stride_ot,
    stride_oh,
    stride_od,
    stride_ar,
    stride_ah,
    stride_as,
    stride_mr,
    stride_mh,
    stride_ms,
    HEAD_SIZE: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
):
    """Program (request, query head): the softmax-weighted merge of the splits, in a
    fixed order (all NUM_SPLITS at once; an empty split has max -inf and weight 0)."""
    req = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    q_start = tl.load(query_start_loc_ptr + req)
    if tl.load(query_start_loc_ptr + req + 1) == q_start:
        return
    splits = tl.arange(0, NUM_SPLITS)
    dims = tl.arange(0, BLOCK_D)
    part = req * stride_mr + head * stride_mh + splits * stride_ms
    maxes = tl.load(maxes_ptr + part)
    weights = tl.exp2(
        maxes - tl.reduce(maxes, 0, tl.standard._elementwise_max)
    )  # [NUM_SPLITS]; the last key's split is finite
    total = tl.reduce(tl.load(sums_ptr + part) * weights, 0, tl.standard._sum_combine)
    acc_rows = acc_ptr + req * stride_ar + head * stride_ah + splits * stride_as
    acc = tl.load(acc_rows[:, None] + dims[None, :])  # [NUM_SPLITS, BLOCK_D]
    out = tl.reduce(acc * weights[:, None], 0, tl.standard._sum_combine) / total
    out_ptrs = out_ptr + q_start.to(tl.int64) * stride_ot + head * stride_oh + dims * stride_od
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=dims < HEAD_SIZE)


@dataclass(frozen=True)
class _Tiles:
    """Tile sides of one attention launch."""

    block_m: int  # rows: (new token, query head) pairs
    block_n: int  # key positions per step of the KV walk
    block_d: int  # head_size padded to a power of two


def reshape_and_cache(
    key: torch.Tensor,  # [>= num_tokens, Hkv, D]
    value: torch.Tensor,  # [>= num_tokens, Hkv, D]
    kv_cache: torch.Tensor,  # [num_blocks, 2, block_size, Hkv, D], key's dtype
    slot_mapping: torch.Tensor,  # int64 [>= num_tokens]
    num_tokens: int,
) -> None:
    """Store rows [0, num_tokens) of key/value at their slots; rows with slot < 0 are
    skipped. Slots are not range-checked (that would synchronize the device)."""
    if num_tokens == 0:
        return  # a launch grid must not be empty
    _, _, block_size, num_kv_heads, head_size = kv_cache.shape
    block_d = _block_d(head_size)
    block_hd = triton.next_power_of_2(num_kv_heads) * block_d
    block_t = max(1, _COPY_TILE // block_hd)
    _reshape_and_cache_kernel[(triton.cdiv(num_tokens, block_t),)](
        key,
        value,
        kv_cache,
        slot_mapping,
        num_tokens,
        *key.stride(),
        *value.stride(),
        *kv_cache.stride(),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_SIZE=head_size,
        BLOCK_SIZE=block_size,
        BLOCK_T=block_t,
        BLOCK_D=block_d,
        BLOCK_HD=block_hd,
    )


def unified_attention(
    out: torch.Tensor,  # [T, Hq, D], written for the rows of the batch's requests
    query: torch.Tensor,  # [T, Hq, D]
    kv_cache: torch.Tensor,  # [num_blocks, 2, block_size, Hkv, D], the step's K/V stored
    batch: FlashAttentionMetadata,
    scale: float,
    sliding_window: int | None,
) -> None:
    """Attention of every new token of the batch (prefill chunks and decodes), one launch."""
    _, _, block_size, num_kv_heads, head_size = kv_cache.shape
    group = query.shape[1] // num_kv_heads
    tiles = _tiles(head_size, group, batch.max_query_len)
    block_q = tiles.block_m // group
    grid = (batch.num_actual_tokens // block_q + batch.num_reqs, num_kv_heads)
    _unified_attention_kernel[grid](
        out,
        query,
        kv_cache,
        batch.block_table,
        batch.query_start_loc,
        batch.seq_lens,
        batch.num_reqs,
        scale * _LOG2E,
        sliding_window or 0,
        *out.stride(),
        *query.stride(),
        batch.block_table.stride(0),
        *kv_cache.stride(),
        HEAD_SIZE=head_size,
        GROUP=group,
        BLOCK_SIZE=block_size,
        BLOCK_M=tiles.block_m,
        BLOCK_Q=block_q,
        BLOCK_N=tiles.block_n,
        BLOCK_D=tiles.block_d,
        USE_WINDOW=sliding_window is not None,
        UPCAST=_upcast(query.dtype),
    )


def split_kv_decode(
    out: torch.Tensor,  # [T, Hq, D]
    query: torch.Tensor,  # [T, Hq, D]
    kv_cache: torch.Tensor,  # [num_blocks, 2, block_size, Hkv, D], the step's K/V stored
    batch: FlashAttentionMetadata,  # every request has at most one new token
    scale: float,
    sliding_window: int | None,
    partials: SplitKVPartials,  # shapes from `partials_shape`
) -> None:
    """Attention of a decode-only batch, each request's keys split NUM_SPLITS ways."""
    _, _, block_size, num_kv_heads, head_size = kv_cache.shape
    group = query.shape[1] // num_kv_heads
    tiles = _tiles(head_size, group, 1)
    _split_kv_decode_kernel[(batch.num_reqs, num_kv_heads, NUM_SPLITS)](
        partials.acc,
        partials.maxes,
        partials.sums,
        query,
        kv_cache,
        batch.block_table,
        batch.query_start_loc,
        batch.seq_lens,
        scale * _LOG2E,
        sliding_window or 0,
        *query.stride(),
        batch.block_table.stride(0),
        *kv_cache.stride(),
        *partials.acc.stride()[:3],
        *partials.maxes.stride(),
        HEAD_SIZE=head_size,
        GROUP=group,
        BLOCK_SIZE=block_size,
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n,
        BLOCK_D=tiles.block_d,
        NUM_SPLITS=NUM_SPLITS,
        USE_WINDOW=sliding_window is not None,
        UPCAST=_upcast(query.dtype),
    )
    _split_kv_reduce_kernel[(batch.num_reqs, query.shape[1])](
        out,
        partials.acc,
        partials.maxes,
        partials.sums,
        batch.query_start_loc,
        *out.stride(),
        *partials.acc.stride()[:3],
        *partials.maxes.stride(),
        HEAD_SIZE=head_size,
        BLOCK_D=tiles.block_d,
        NUM_SPLITS=NUM_SPLITS,
    )


def partials_shape(num_heads: int, head_size: int) -> tuple[int, int, int]:
    """(Hq, NUM_SPLITS, block_d): the per-request shape of the split-KV partial output."""
    return num_heads, NUM_SPLITS, _block_d(head_size)


def _tiles(head_size: int, group: int, max_query_len: int) -> _Tiles:
    """Row tiles of 16 for decode-sized work, up to 64 for prefill chunks, always room for
    one token's group of heads; key tiles of 64, 32 for head sizes past 128 (the K and V
    tiles must fit in shared memory)."""
    block_d = _block_d(head_size)
    wanted = min(64, triton.next_power_of_2(group * max_query_len))
    block_m = max(_MIN_TILE, triton.next_power_of_2(group), wanted)
    return _Tiles(block_m=block_m, block_n=64 if block_d <= 128 else 32, block_d=block_d)


def _block_d(head_size: int) -> int:
    return max(_MIN_TILE, triton.next_power_of_2(head_size))


def _upcast(dtype: torch.dtype) -> bool:
    """Whether tiles go to float32 before tl.dot: bfloat16 under the interpreter only."""
    return _INTERPRETED and dtype == torch.bfloat16
