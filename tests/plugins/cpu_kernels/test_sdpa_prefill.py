"""Prefill attention on torch's flash op against a float64 dense reference and the C++ kernel,
over caches in the query's dtype and FP8 ones."""

from __future__ import annotations

import pytest
import torch
from fp8_caches import FP8, SCALES, store_fp8

from core.attention.kv_cache_dtype import FP8_KV_CACHE_DTYPES, dequantize_kv

REASON = "core-cpu-kernels is not installed (optional plugin)"
sdpa = pytest.importorskip("core_cpu_kernels.sdpa_prefill", reason=REASON)
_C = pytest.importorskip("core_cpu_kernels._C", reason=REASON)  # after torch: links libtorch

NUM_BLOCKS, BLOCK_SIZE = 64, 16
BF16_EPS = torch.finfo(torch.bfloat16).eps  # 2^-7: one ulp at 1.0

# (cached context, new tokens): a one-token chunk with and without context, chunks ending
# inside and exactly at a block edge (seq_len 48, 32), contexts within and across blocks.
CHUNKS = [(0, 1), (0, 37), (13, 1), (16, 32), (5, 27), (45, 40), (100, 3)]


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def paged_cache(dtype: torch.dtype, kv_heads: int, head_size: int) -> torch.Tensor:
    """[NUM_BLOCKS, 2, BLOCK_SIZE, Hkv, D] random, one layer of two interleaved per block,
    so consecutive pages are a page apart (only head_size is contiguous, as promised)."""
    shape = (NUM_BLOCKS, 2, 2, BLOCK_SIZE, kv_heads, head_size)  # [block, layer, K/V, ...]
    return torch.randn(shape, generator=generator(0)).to(dtype)[:, 1]


def block_ids(seq_len: int, seed: int) -> torch.Tensor:
    """Distinct shuffled blocks, as a long-running pool hands them out."""
    return torch.randperm(NUM_BLOCKS, generator=generator(seed))[: -(-seq_len // BLOCK_SIZE)]


def dense_reference(
    query: torch.Tensor, cache: torch.Tensor, blocks: torch.Tensor, seq_len: int, scale: float
) -> torch.Tensor:  # [q_len, Hq, D] float64
    """softmax(Q K^T * scale + causal mask) V over the keys at positions [0, seq_len)."""
    q_len, heads = query.shape[:2]
    pos = torch.arange(seq_len)
    kv = cache[blocks[pos // BLOCK_SIZE], :, pos % BLOCK_SIZE].double()  # [seq, 2, Hkv, D]
    group = heads // kv.shape[2]
    k, v = (kv[:, i].repeat_interleave(group, dim=1) for i in (0, 1))  # [seq, Hq, D]
    scores = torch.einsum("qhd,khd->hqk", query.double(), k) * scale
    q_pos = pos[seq_len - q_len :, None]
    scores = scores.masked_fill(pos[None, :] > q_pos, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def problem(
    dtype: torch.dtype, heads: int, kv_heads: int, head_size: int, context: int, q_len: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """(query, cache, block_ids, seq_len) for one chunk after `context` cached tokens."""
    seq_len = context + q_len
    query = torch.randn(q_len, heads, head_size, generator=generator(1)).to(dtype)
    return query, paged_cache(dtype, kv_heads, head_size), block_ids(seq_len, 2), seq_len


def cpp_kernel(
    query: torch.Tensor, cache: torch.Tensor, blocks: torch.Tensor, seq_len: int, scale: float
) -> torch.Tensor:
    """The C++ kernel, called as CpuPagedImpl.forward_prefill calls it for one chunk."""
    out = torch.empty(query.shape, dtype=query.dtype)
    q_len = query.shape[0]
    _C.paged_prefill_attention(out, query, cache, blocks[None], [0, q_len], [seq_len], scale, 0)
    return out


def assert_bf16_close(got: torch.Tensor, expected: torch.Tensor) -> None:
    """Within 2 bfloat16 eps relative (plus one absolute, for results near 0): the op
    rounds the softmax weights to bfloat16 before P @ V and rounds its output; with context
    two outputs and the blend weight are rounded (2^-9 relative each) and lerp rounds the
    result once more. The worst case here uses 0.7 of it (the C++ kernel 0.15)."""
    torch.testing.assert_close(got.double(), expected.double(), atol=BF16_EPS, rtol=2 * BF16_EPS)


GQA_HEADS = [(4, 4, 64), (6, 2, 128), (3, 1, 64)]  # (Hq, Hkv, D): ratios 1 and 3


@pytest.mark.parametrize(("heads", "kv_heads", "head_size"), GQA_HEADS)
@pytest.mark.parametrize(("context", "q_len"), CHUNKS)
def test_float32_matches_the_float64_dense_reference(heads, kv_heads, head_size, context, q_len):
    query, cache, blocks, seq_len = problem(
        torch.float32, heads, kv_heads, head_size, context, q_len
    )
    scale = head_size**-0.5
    got = sdpa.sdpa_prefill(query, cache, blocks, seq_len, scale, 0)
    assert got.dtype == torch.float32 and got.shape == query.shape
    expected = dense_reference(query, cache, blocks, seq_len, scale)
    torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("heads", "kv_heads", "head_size"), GQA_HEADS)
@pytest.mark.parametrize(("context", "q_len"), CHUNKS)
def test_bfloat16_matches_the_float64_reference_of_its_inputs(
    heads, kv_heads, head_size, context, q_len
):
    query, cache, blocks, seq_len = problem(
        torch.bfloat16, heads, kv_heads, head_size, context, q_len
    )
    scale = head_size**-0.5
    got = sdpa.sdpa_prefill(query, cache, blocks, seq_len, scale, 0)
    assert got.dtype == torch.bfloat16
    assert_bf16_close(got, dense_reference(query, cache, blocks, seq_len, scale))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("context", "q_len"), [(0, 37), (13, 1), (45, 40), (100, 3)])
def test_matches_the_cpp_kernel(dtype, context, q_len):
    query, cache, blocks, seq_len = problem(dtype, 9, 3, 64, context, q_len)
    got = sdpa.sdpa_prefill(query, cache, blocks, seq_len, 0.125, 0)
    expected = cpp_kernel(query, cache, blocks, seq_len, 0.125)
    if dtype == torch.float32:
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    else:  # the C++ kernel rounds its float32 result once: half an ulp more apart
        assert_bf16_close(got, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_long_chunk_on_long_context_matches_the_reference(dtype):
    # Several of the op's query and key tiles, and (on a CPU with AMX, >= 4 heads of a
    # multiple of 64) its packed oneDNN path.
    query, cache, blocks, seq_len = problem(dtype, 8, 2, 128, 700, 300)
    got = sdpa.sdpa_prefill(query, cache, blocks, seq_len, 128**-0.5, 0)
    expected = dense_reference(query, cache, blocks, seq_len, 128**-0.5)
    if dtype == torch.float32:
        torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1e-5)
    else:
        assert_bf16_close(got, expected)


def test_a_strided_query_is_read_as_its_values():
    context, q_len, heads, head_size = 20, 9, 4, 64
    cache, blocks = paged_cache(torch.float32, 2, head_size), block_ids(context + q_len, 2)
    # Rows of a fused QKV, and every other element of a wider tensor (the flash op itself
    # would read that last dimension as contiguous).
    fused = torch.randn(q_len, heads + 4, head_size, generator=generator(3))[:, :heads]
    spaced = torch.randn(q_len, heads, 2 * head_size, generator=generator(4))[..., ::2]
    for query in (fused, spaced):
        got = sdpa.sdpa_prefill(query, cache, blocks, context + q_len, 0.125, 0)
        expected = dense_reference(query, cache, blocks, context + q_len, 0.125)
        torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [45, 60])
def test_a_window_as_long_as_the_context_is_served_as_none(window):
    query, cache, blocks, seq_len = problem(torch.float32, 4, 2, 64, 25, 20)  # seq_len 45
    assert sdpa.takes(query, cache, seq_len, window)
    got = sdpa.sdpa_prefill(query, cache, blocks, seq_len, 0.125, window)
    expected = dense_reference(query, cache, blocks, seq_len, 0.125)
    torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kv_cache_dtype", FP8)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("context", "q_len"), [(0, 37), (45, 40), (100, 3)])
def test_an_fp8_cache_is_attended_as_the_reference_reads_it(kv_cache_dtype, dtype, context, q_len):
    query, _, blocks, seq_len = problem(dtype, 6, 2, 64, context, q_len)
    cache = store_fp8(paged_cache(FP8_KV_CACHE_DTYPES[kv_cache_dtype], 2, 64), SCALES)
    assert sdpa.takes(query, cache, seq_len, 0)
    got = sdpa.sdpa_prefill(query, cache, blocks, seq_len, 0.125, 0, SCALES)
    # The reference reads stored * scale in the query's dtype (TorchRefImpl.read_pages).
    scales = (SCALES.k_scale, SCALES.v_scale)
    read = torch.stack([dequantize_kv(cache[:, i], scales[i], dtype) for i in (0, 1)], dim=1)
    expected = dense_reference(query, read, blocks, seq_len, 0.125)
    # K/V up to 126 in magnitude: scores of up to ~1e3 and outputs of up to ~400, whose
    # rounding errors (float32's, or bfloat16's of the softmax weights) scale with them.
    tolerance = 1e-5 if dtype == torch.float32 else BF16_EPS
    atol = tolerance * expected.abs().max().item()
    torch.testing.assert_close(got.double(), expected, atol=atol, rtol=2 * tolerance)


def test_takes_float32_and_bfloat16_without_a_biting_window():
    for dtype in (torch.float32, torch.bfloat16):
        query, cache = torch.zeros(5, 4, 64, dtype=dtype), paged_cache(dtype, 2, 64)
        assert sdpa.takes(query, cache, seq_len=30, sliding_window=0)


def test_refuses_what_needs_a_mask_or_another_dtype():
    query, cache = torch.zeros(5, 4, 64), paged_cache(torch.float32, 2, 64)
    refused = {
        "float16": (query.half(), cache.half(), 30, 0),
        "float64": (query.double(), cache.double(), 30, 0),
        "dtype mismatch": (query.bfloat16(), cache, 30, 0),
        "window cuts keys off": (query, cache, 30, 29),
        "window of one": (query, cache, 30, 1),
        "heads not a multiple": (torch.zeros(5, 3, 64), cache, 30, 0),
        "chunk past seq_len": (query, cache, 4, 0),
    }
    for case, args in refused.items():
        assert not sdpa.takes(*args), case
    with pytest.raises(ValueError, match="sliding_window 29 < seq_len 30 needs a mask"):
        sdpa.sdpa_prefill(query, cache, block_ids(30, 2), 30, 0.125, 29)


def test_too_few_blocks_for_seq_len_are_refused():
    query, cache = torch.zeros(5, 4, 64), paged_cache(torch.float32, 2, 64)
    with pytest.raises(ValueError, match="2 blocks cannot hold 33 keys"):
        sdpa.sdpa_prefill(query, cache, block_ids(32, 2), 33, 0.125, 0)
