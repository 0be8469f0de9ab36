"""Causal prefill attention on torch's CPU flash kernel, a candidate beside the C++ one.

`aten::_scaled_dot_product_flash_attention_for_cpu` tiles the scores and never holds a
[q_len, kv_len] matrix; for bfloat16 its block products go to oneDNN (brgemm), which
takes the AMX tiles of a Xeon that has them where the C++ kernel does float32 outer
products. The engine picks between the two by measurement; this module only serves the
C++ kernel's contract for one chunk.

Its causal mask is aligned top-left (query i sees keys 0..i), so a chunk on cached
context takes two calls: its queries against the cached keys unmasked, and against its
own keys causally. Each call returns the log-sum-exp of its rows' scores, which weighs
the two partial outputs into the softmax over all the keys (flash attention's merge). The
op takes Hq a multiple of Hkv as it is (query head h reads KV head h // (Hq // Hkv)) and
strided [1, H, L, D] views, so neither the query nor the gathered K/V is copied again
(unless the query's last dimension is strided, which the op would misread as contiguous).

An FP8 cache's pages are dequantized as they are gathered (stored * scale in the query's
dtype), as the reference reads them.

A sliding window that cuts keys off (shorter than seq_len) would need a mask tensor:
`takes` refuses it, and the C++ kernel serves it.
"""

from __future__ import annotations

import torch

from core.attention.backends.torch_ref import gather_pages
from core.attention.kv_cache_dtype import FP8_KV_CACHE_DTYPES, KVCacheScales, dequantize_kv

__all__ = ["sdpa_prefill", "takes"]

_DTYPES = frozenset({torch.float32, torch.bfloat16})
_FP8_DTYPES = frozenset(FP8_KV_CACHE_DTYPES.values())
_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def takes(query: torch.Tensor, kv_cache: torch.Tensor, seq_len: int, sliding_window: int) -> bool:
    """Whether `sdpa_prefill` serves this problem (see `_refusal` for what it refuses)."""
    return _refusal(query, kv_cache, seq_len, sliding_window) is None


def sdpa_prefill(
    query: torch.Tensor,  # [q_len, Hq, D]
    kv_cache: torch.Tensor,  # [num_blocks, 2, block_size, Hkv, D]
    block_ids: torch.Tensor,  # [ceil(seq_len / block_size)] int64
    seq_len: int,
    scale: float,
    sliding_window: int,
    kv_scales: KVCacheScales = KVCacheScales(),
) -> torch.Tensor:  # [q_len, Hq, D]
    """Causal attention of one chunk of q_len new tokens at positions [seq_len - q_len,
    seq_len), the contract of `_C.paged_prefill_attention` for one chunk.

    Every key, the chunk's own included, is read from `kv_cache` through `block_ids` (the
    layout of `TorchRefImpl`): in the query's dtype, or FP8 read as stored * `kv_scales`;
    `query` may be strided (a view of a fused QKV). `sliding_window` 0 means none. The
    result is in the query's dtype. Raises ValueError for a problem `takes` refuses or a
    `block_ids` too short for `seq_len`.
    """
    refusal = _refusal(query, kv_cache, seq_len, sliding_window)
    if refusal is not None:
        raise ValueError(f"sdpa_prefill: {refusal}")
    if len(block_ids) * kv_cache.shape[2] < seq_len:
        raise ValueError(f"sdpa_prefill: {len(block_ids)} blocks cannot hold {seq_len} keys")
    if query.stride(-1) != 1:  # the op reads a strided last dimension wrong, silently
        query = query.contiguous()
    context = seq_len - query.shape[0]
    k, v = gather_pages(kv_cache, block_ids)  # [>= seq_len, Hkv, D], contiguous
    if kv_cache.dtype in _FP8_DTYPES:
        k = dequantize_kv(k, kv_scales.k_scale, query.dtype)
        v = dequantize_kv(v, kv_scales.v_scale, query.dtype)
    out, lse = _attend(query, k[context:seq_len], v[context:seq_len], scale, causal=True)
    if context > 0:
        past, past_lse = _attend(query, k[:context], v[:context], scale, causal=False)
        out = _merge(past, past_lse, out, lse)
    return out[0].transpose(0, 1)


def _refusal(
    query: torch.Tensor, kv_cache: torch.Tensor, seq_len: int, sliding_window: int
) -> str | None:
    """Why the flash op cannot serve this problem, or None when it can."""
    if query.dtype not in _DTYPES:
        return f"dtype {query.dtype} is not one of float32, bfloat16"
    if kv_cache.dtype != query.dtype and kv_cache.dtype not in _FP8_DTYPES:
        return f"kv_cache dtype {kv_cache.dtype} is neither the query's {query.dtype} nor FP8"
    if query.device.type != "cpu" or kv_cache.device.type != "cpu":
        return "the flash op here is the CPU one"
    if query.shape[1] % kv_cache.shape[3]:
        return f"{query.shape[1]} query heads are no multiple of {kv_cache.shape[3]} KV heads"
    if not 0 < query.shape[0] <= seq_len:
        return f"a chunk of {query.shape[0]} tokens does not fit seq_len {seq_len}"
    # A window as long as the context hides no key, so it needs no mask.
    if 0 < sliding_window < seq_len:
        return f"sliding_window {sliding_window} < seq_len {seq_len} needs a mask"
    return None


def _attend(
    query: torch.Tensor,  # [q_len, Hq, D]
    key: torch.Tensor,  # [kv_len, Hkv, D]
    value: torch.Tensor,  # [kv_len, Hkv, D]
    scale: float,
    causal: bool,  # top-left aligned: query i sees keys 0..i
) -> tuple[torch.Tensor, torch.Tensor]:
    """One flash call on transposed views: (out [1, Hq, q_len, D] in the query's dtype,
    stored [q_len, Hq, D]; log-sum-exp of each row's scaled scores [1, Hq, q_len] float32)."""
    q, k, v = (x.transpose(0, 1)[None] for x in (query, key, value))  # [1, H, L, D]
    return _flash(q, k, v, 0.0, causal, scale=scale)


def _merge(
    past: torch.Tensor,  # [1, Hq, q_len, D]: softmax over the cached keys alone
    past_lse: torch.Tensor,  # [1, Hq, q_len] float32: log-sum-exp of those scores
    own: torch.Tensor,  # [1, Hq, q_len, D]: over the chunk's own keys
    own_lse: torch.Tensor,  # [1, Hq, q_len] float32
) -> torch.Tensor:  # [1, Hq, q_len, D]: the softmax over all keys, in `past`'s storage
    """Weigh two partial attentions by their shares of the total exp-sum.

    own's share is e^own_lse / (e^past_lse + e^own_lse) = sigmoid(own_lse - past_lse),
    which never overflows. lerp blends in one pass over the output; it wants the weight in
    the output's dtype, so bfloat16 rounds the weight (2^-9 relative), about as much as
    rounding the result does.
    """
    own_share = torch.sigmoid(own_lse - past_lse)[..., None]  # [1, Hq, q_len, 1]
    return past.lerp_(own, own_share.to(past.dtype))
