"""The C++ prefill kernel against the reference backend's prefill attention, over caches in
the query's dtype and FP8 ones (--kv-cache-dtype) the reference reads the same."""

from __future__ import annotations

import pytest
import torch
from fp8_caches import FP8, SCALES, finite_values, store_fp8

from core.attention.backends.torch_ref import TorchRefImpl
from core.attention.interface import AttentionType
from core.attention.kv_cache_dtype import FP8_KV_CACHE_DTYPES, KVCacheScales, dequantize_kv
from core.attention.paged_metadata import DecodeBatch, PagedAttentionMetadata, PrefillChunk
from core.kernel_choice import Problem
from core.kv_cache.layout import KVCacheTensor, create_kv_cache_view

backend = pytest.importorskip(
    "core_cpu_kernels.backend", reason="core-cpu-kernels is not installed (optional plugin)"
)
_C = backend._C

NUM_BLOCKS, BLOCK_SIZE = 48, 16
HEAD_SIZES = [16, 32, 64, 80, 96, 128, 256]  # what CpuPagedBackend declares


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def paged_cache(
    dtype: torch.dtype, kv_heads: int, head_size: int, layout: str = "layer_outermost"
) -> torch.Tensor:
    """A random cache; "block_outermost" interleaves two layers so pages are strided."""
    page = (2, BLOCK_SIZE, kv_heads, head_size)
    page_bytes = torch.Size(page).numel() * dtype.itemsize
    tensor = getattr(KVCacheTensor, layout)(("other", "this"), NUM_BLOCKS, page_bytes)
    buffer = torch.zeros(tensor.size, dtype=torch.int8)
    cache = create_kv_cache_view(buffer, tensor, "this", NUM_BLOCKS, page, dtype)
    cache.copy_(torch.randn(cache.shape, generator=generator(0)))
    return cache


def block_ids(seq_len: int, seed: int) -> torch.Tensor:
    """Distinct, shuffled blocks (as a long-running pool hands out), block 0 excluded."""
    order = torch.randperm(NUM_BLOCKS - 1, generator=generator(seed)) + 1
    return order[: -(-seq_len // BLOCK_SIZE)]


def chunk_rows(
    cache: torch.Tensor, blocks: torch.Tensor, positions: range
) -> tuple[torch.Tensor, torch.Tensor]:
    """The K and V the cache holds at `positions` (forward_prefill finds them stored)."""
    index = torch.tensor(list(positions))
    pages = cache[blocks[index // BLOCK_SIZE], :, index % BLOCK_SIZE]  # [n, 2, Hkv, D]
    return pages[:, 0], pages[:, 1]


def fp8_cache(
    kv_cache_dtype: str, kv_heads: int, head_size: int, layout: str = "layer_outermost"
) -> torch.Tensor:
    """An FP8 cache holding random K/V as the reference stores them with SCALES."""
    dtype = FP8_KV_CACHE_DTYPES[kv_cache_dtype]
    return store_fp8(paged_cache(dtype, kv_heads, head_size, layout), SCALES)


def prefill_both(
    impl_args: tuple,
    cache: torch.Tensor,
    context: int,
    q_len: int,
    seed: int = 1,
    dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk of q_len new tokens after `context` cached ones, its query in `dtype` (the
    cache's when None): (kernel, reference in float32). An FP8 cache is read with SCALES."""
    heads, head_size = impl_args[0], impl_args[1]
    seq_len = context + q_len
    blocks = block_ids(seq_len, seed)
    chunk = PrefillChunk(0, q_len, seq_len, blocks)
    query = torch.randn(q_len, heads, head_size, generator=generator(seed)).to(dtype or cache.dtype)
    key, value = chunk_rows(cache, blocks, range(context, seq_len))
    scales = {}
    if cache.dtype in FP8_KV_CACHE_DTYPES.values():  # the chunk's K/V as forward reads them
        scales = {"kv_scales": SCALES}
        key = dequantize_kv(key, SCALES.k_scale, query.dtype)
        value = dequantize_kv(value, SCALES.v_scale, query.dtype)
    got = backend.CpuPagedImpl(*impl_args, **scales).forward_prefill(
        query, key, value, cache, chunk
    )
    # The kernel reads 16-bit inputs exactly and accumulates in float32: compare with the
    # float32 result.
    reference = TorchRefImpl(*impl_args, **scales)
    upcast = (t.float() if t.dtype.itemsize == 2 else t for t in (query, key, value, cache))
    expected = reference.forward_prefill(*upcast, chunk)
    return got, expected


def assert_float32_close(got: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("layout", ["layer_outermost", "block_outermost"])
@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_size", "window"),
    [(9, 3, 64, None), (4, 4, 32, None), (8, 2, 16, 20), (6, 1, 16, 5)],
)
@pytest.mark.parametrize(("context", "q_len"), [(0, 2), (0, 37), (16, 16), (45, 40), (100, 3)])
def test_float32_prefill_matches_the_reference(
    layout, heads, kv_heads, head_size, window, context, q_len
):
    cache = paged_cache(torch.float32, kv_heads, head_size, layout)
    args = (heads, head_size, head_size**-0.5, kv_heads, window)
    assert_float32_close(*prefill_both(args, cache, context, q_len))


@pytest.mark.parametrize("context", [0, 13])
@pytest.mark.parametrize("q_len", range(1, BLOCK_SIZE + 2))
def test_chunks_across_block_edges_match_the_reference(context, q_len):
    # 13 cached tokens: the chunk starts inside a block, so its keys cross block edges.
    cache = paged_cache(torch.float32, 2, 16)
    assert_float32_close(*prefill_both((4, 16, 0.25, 2, None), cache, context, q_len))


@pytest.mark.parametrize("head_size", HEAD_SIZES)
def test_every_declared_head_size_matches_the_reference(head_size):
    cache = paged_cache(torch.float32, 1, head_size)
    args = (2, head_size, head_size**-0.5, 1, None)
    assert_float32_close(*prefill_both(args, cache, 20, 5))


def assert_rounded_once(got: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    """got, in `dtype`, is the float32 result rounded once."""
    assert got.dtype == dtype
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(got.float(), expected, atol=eps, rtol=eps)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("context", [0, 30])
def test_half_precision_prefill_matches_the_reference_in_float32(dtype, context):
    cache = paged_cache(dtype, 3, 64)
    got, expected = prefill_both((9, 64, 64**-0.5, 3, None), cache, context, 20, seed=2)
    assert_rounded_once(got, expected, dtype)


@pytest.mark.parametrize("kv_cache_dtype", FP8)
@pytest.mark.parametrize("layout", ["layer_outermost", "block_outermost"])
@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_size", "window"),
    [(9, 3, 64, None), (4, 4, 32, None), (8, 2, 16, 20), (6, 1, 16, 5)],
)
@pytest.mark.parametrize(("context", "q_len"), [(0, 2), (0, 37), (16, 16), (45, 40), (100, 3)])
def test_fp8_prefill_matches_the_reference_reading_the_same_cache(
    kv_cache_dtype, layout, heads, kv_heads, head_size, window, context, q_len
):
    # Cacheless prompts and chunks on cached context, GQA, windows, strided pages.
    cache = fp8_cache(kv_cache_dtype, kv_heads, head_size, layout)
    args = (heads, head_size, head_size**-0.5, kv_heads, window)
    assert_close_to_its_scale(*prefill_both(args, cache, context, q_len, dtype=torch.float32))


def assert_close_to_its_scale(got: torch.Tensor, expected: torch.Tensor) -> None:
    """Float32 results over an FP8 cache of K/V up to 126 in magnitude (scores of up to
    ~1e3, whose rounding moves the output by up to 1e-6 of its scale)."""
    tolerance = 1e-5 * expected.abs().max().item()
    torch.testing.assert_close(got, expected, atol=tolerance, rtol=1e-5)


@pytest.mark.parametrize("kv_cache_dtype", FP8)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_prefill_on_an_fp8_cache_matches_the_reference_in_float32(
    kv_cache_dtype, dtype
):
    cache = fp8_cache(kv_cache_dtype, 3, 64)
    got, expected = prefill_both((9, 64, 64**-0.5, 3, None), cache, 30, 20, seed=2, dtype=dtype)
    assert_rounded_once(got, expected, dtype)


@pytest.mark.parametrize("kv_cache_dtype", FP8)
def test_every_finite_fp8_value_reads_as_torchs_times_the_scale(kv_cache_dtype):
    # One token: its key's weight is exactly 1, so the output is its value row, times v_scale.
    dtype = FP8_KV_CACHE_DTYPES[kv_cache_dtype]
    cache, blocks = paged_cache(dtype, 1, 256), block_ids(1, 1)
    values = finite_values(dtype, 256)  # subnormals, normals, the largest, signed zeros
    cache[blocks[0], 1, 0, 0] = values
    query, out = torch.randn(1, 2, 256), torch.empty(1, 2, 256)
    _C.paged_prefill_attention(out, query, cache, blocks[None], [0, 1], [1], 0.0625, 0,
                               SCALES.k_scale, SCALES.v_scale)  # fmt: skip
    expected = values.float() * SCALES.v_scale
    torch.testing.assert_close(out[0], expected.expand(2, -1), rtol=0, atol=0)


def padded_table(tables: list[torch.Tensor]) -> torch.Tensor:
    """Block tables as the rows of one [n, max_blocks] tensor (padded with block 0)."""
    width = max(len(t) for t in tables)
    return torch.stack([torch.nn.functional.pad(t, (0, width - len(t))) for t in tables])


def step_metadata(requests: list[tuple[int, int]]) -> PagedAttentionMetadata:
    """A step of requests given as (cached context, new tokens), rows in request order."""
    chunks, decode_rows, decode_lens, decode_tables, slots = [], [], [], [], []
    row = 0
    for i, (context, new) in enumerate(requests):
        seq_len, blocks = context + new, block_ids(context + new, 10 + i)
        if new > 1:
            chunks.append(PrefillChunk(row, row + new, seq_len, blocks))
        else:
            decode_rows.append(row)
            decode_lens.append(seq_len)
            decode_tables.append(blocks)
        slots += [
            blocks[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(context, seq_len)
        ]
        row += new
    table = padded_table(decode_tables)
    decode = DecodeBatch(
        token_index=torch.tensor(decode_rows),
        block_table=table,
        seq_lens=torch.tensor(decode_lens),
        key_positions=torch.arange(table.shape[1] * BLOCK_SIZE)[None, :],
    )
    return PagedAttentionMetadata(torch.tensor(slots), chunks, decode)


def test_a_step_of_several_chunks_and_decodes_matches_the_reference():
    heads, kv_heads, head_size = 6, 2, 32
    # Two fresh prompts, one chunk on cached context, two decodes.
    metadata = step_metadata([(0, 17), (5, 1), (30, 12), (0, 2), (63, 1)])
    num_tokens = len(metadata.slot_mapping)
    qkv = [
        torch.randn(num_tokens, h, head_size, generator=generator(s))
        for s, h in enumerate((heads, kv_heads, kv_heads))
    ]
    args = (heads, head_size, head_size**-0.5, kv_heads, None)
    cache = paged_cache(torch.float32, kv_heads, head_size)
    expected = TorchRefImpl(*args).forward(*qkv, cache.clone(), metadata)
    got = backend.CpuPagedImpl(*args).forward(*qkv, cache, metadata)
    assert_float32_close(got, expected)


def test_one_kernel_call_attends_several_chunks_of_a_strided_query():
    heads, kv_heads, head_size, window = 4, 2, 16, 9
    cache = paged_cache(torch.float32, kv_heads, head_size)
    query_start_loc, seq_lens = [0, 20, 27, 44], [33, 7, 80]  # rows 44.. are in no chunk
    tables = [block_ids(seq_len, 20 + c) for c, seq_len in enumerate(seq_lens)]
    fused = torch.randn(48, heads + 2 * kv_heads, head_size, generator=generator(3))
    query = fused[:, :heads]  # rows are strided, as in a fused QKV projection
    out = torch.full((48, heads, head_size), 7.0)
    _C.paged_prefill_attention(
        out, query, cache, padded_table(tables), query_start_loc, seq_lens, 0.25, window
    )
    reference = TorchRefImpl(heads, head_size, 0.25, kv_heads, window)
    for c, seq_len in enumerate(seq_lens):
        start, end = query_start_loc[c], query_start_loc[c + 1]
        chunk = PrefillChunk(start, end, seq_len, tables[c])
        key, value = chunk_rows(cache, tables[c], range(seq_len - (end - start), seq_len))
        expected = reference.forward_prefill(query[start:end], key, value, cache, chunk)
        assert_float32_close(out[start:end], expected)
    assert (out[44:] == 7.0).all()


def test_encoder_only_prefill_stays_bidirectional():
    cache = paged_cache(torch.float32, 2, 16)
    args = (4, 16, 0.25, 2, None, AttentionType.ENCODER_ONLY)
    got, expected = prefill_both(args, cache, 0, 9)
    assert_float32_close(got, expected)
    causal, _ = prefill_both(args[:5], cache, 0, 9)
    assert not torch.allclose(got[:-1], causal[:-1])  # the first tokens see later ones


def test_bad_inputs_are_refused_with_the_reason():
    cache = paged_cache(torch.float32, 2, 16)
    table = block_ids(40, 1)[None]
    query, out = torch.randn(8, 4, 16), torch.empty(8, 4, 16)

    def call(**changes):
        args = dict(
            out=out,
            query=query,
            kv_cache=cache,
            block_table=table,
            query_start_loc=[0, 8],
            seq_lens=[40],
            scale=0.25,
            sliding_window=0,
        )
        args.update(changes)
        _C.paged_prefill_attention(*args.values())

    with pytest.raises(RuntimeError, match="kv_cache dtype must match query"):
        call(query=query.bfloat16(), out=out.bfloat16())
    with pytest.raises(RuntimeError, match="block_table has too few blocks"):
        call(seq_lens=[80])
    with pytest.raises(RuntimeError, match="seq_len >= its new tokens"):
        call(seq_lens=[5])
    with pytest.raises(RuntimeError, match="query_start_loc must index rows of query"):
        call(query_start_loc=[0, 9])
    with pytest.raises(RuntimeError, match="sliding_window must be >= 0"):
        call(sliding_window=-1)


@pytest.mark.parametrize(
    ("kernel", "window", "context", "q_len", "runs", "kv_cache_dtype"),
    [
        ("paged", None, 45, 40, "paged", "auto"),
        ("sdpa", None, 0, 37, "sdpa", "auto"),
        ("sdpa", None, 45, 40, "sdpa", "auto"),
        ("sdpa", 20, 45, 40, "paged", "auto"),  # a window cutting keys off: the C++ kernel
        ("paged", None, 45, 40, "paged", "fp8_e5m2"),
        ("sdpa", None, 0, 37, "sdpa", "fp8_e4m3"),  # the pages dequantized
        ("sdpa", None, 45, 40, "sdpa", "fp8_e5m2"),
    ],
)
def test_the_chosen_prefill_kernel_serves_the_chunk(
    kernel, window, context, q_len, runs, kv_cache_dtype, choices, monkeypatch
):
    candidates = backend.candidates
    ran: list[str] = []
    for name, owner, attribute in [
        ("paged", candidates, "_paged_prefill"),
        ("sdpa", candidates.sdpa_prefill, "sdpa_prefill"),
    ]:
        real = getattr(owner, attribute)
        monkeypatch.setattr(owner, attribute, lambda *a, n=name, f=real: ran.append(n) or f(*a))
    monkeypatch.setenv("CORE_KERNEL_CHOICE", f"prefill_attention={kernel}")
    args = (9, 64, 0.125, 3, window)
    if kv_cache_dtype == "auto":
        cache = paged_cache(torch.float32, 3, 64)
        assert_float32_close(*prefill_both(args, cache, context, q_len))
    else:
        cache = fp8_cache(kv_cache_dtype, 3, 64)
        assert_close_to_its_scale(*prefill_both(args, cache, context, q_len, dtype=torch.float32))
    assert ran == [runs]


def test_a_dummy_forward_records_the_layers_prefill_problem(choices):
    impl = backend.CpuPagedImpl(9, 64, 0.125, 3, None)
    with choices.recording() as recorded:
        impl.record_kernel_problems(torch.zeros(1, 9, 64, dtype=torch.bfloat16))
    assert list(recorded) == [Problem("prefill_attention", "bfloat16", (9, 3, 64))]
    fp8 = backend.CpuPagedImpl(9, 64, 0.125, 3, None, kv_scales=SCALES)
    with choices.recording() as recorded:
        fp8.record_kernel_problems(torch.zeros(1, 9, 64, dtype=torch.bfloat16))
    assert list(recorded) == [Problem("prefill_attention", "fp8/bfloat16", (9, 3, 64))]
    encoder = backend.CpuPagedImpl(9, 64, 0.125, 3, None, AttentionType.ENCODER_ONLY)
    with choices.recording() as recorded:
        encoder.record_kernel_problems(torch.zeros(1, 9, 64))
    assert recorded == {}  # encoder-only layers stay on the reference


@pytest.mark.parametrize("fp8", [False, True])
def test_prefill_kernels_are_timed_on_a_cache_of_the_layers_kind(fp8, choices):
    impl = backend.CpuPagedImpl(9, 64, 0.125, 3, None, kv_scales=SCALES if fp8 else None)
    with choices.recording() as recorded:
        impl.record_kernel_problems(torch.zeros(1, 9, 64))
    ((problem, args),) = recorded.items()
    prompt = backend.candidates._prompt_of(problem, args, 20)
    query, cache, _, seq_len, _, _, scales = prompt
    assert cache.dtype is (FP8_KV_CACHE_DTYPES["fp8_e4m3"] if fp8 else torch.float32)
    assert scales == (SCALES if fp8 else KVCacheScales())
    results = [candidate(*prompt) for candidate in choices.candidates["prefill_attention"]]
    assert len(results) == 2 and query.shape == (seq_len, 9, 64)
    torch.testing.assert_close(results[0], results[1], atol=1e-5, rtol=1e-5)
