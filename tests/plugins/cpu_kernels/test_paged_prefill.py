"""The C++ prefill kernel against the reference backend's prefill attention."""

from __future__ import annotations

import pytest
import torch

from core.attention.backends.torch_ref import TorchRefImpl
from core.attention.interface import AttentionType
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


def prefill_both(
    impl_args: tuple, cache: torch.Tensor, context: int, q_len: int, seed: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk of q_len new tokens after `context` cached ones: (kernel, reference)."""
    heads, head_size = impl_args[0], impl_args[1]
    seq_len = context + q_len
    blocks = block_ids(seq_len, seed)
    chunk = PrefillChunk(0, q_len, seq_len, blocks)
    query = torch.randn(q_len, heads, head_size, generator=generator(seed)).to(cache.dtype)
    key, value = chunk_rows(cache, blocks, range(context, seq_len))
    got = backend.CpuPagedImpl(*impl_args).forward_prefill(query, key, value, cache, chunk)
    expected = TorchRefImpl(*impl_args).forward_prefill(query, key, value, cache, chunk)
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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("context", [0, 30])
def test_half_precision_prefill_matches_the_reference_in_float32(dtype, context):
    cache = paged_cache(dtype, 3, 64)
    args = (9, 64, 64**-0.5, 3, None)
    seq_len = context + 20
    blocks = block_ids(seq_len, 1)
    chunk = PrefillChunk(0, 20, seq_len, blocks)
    query = torch.randn(20, 9, 64, generator=generator(2)).to(dtype)
    key, value = chunk_rows(cache, blocks, range(context, seq_len))
    got = backend.CpuPagedImpl(*args).forward_prefill(query, key, value, cache, chunk)
    # The kernel reads 16-bit inputs exactly and accumulates in float32: its output is the
    # float32 result rounded once.
    upcast = (query.float(), key.float(), value.float(), cache.float(), chunk)
    expected = TorchRefImpl(*args).forward_prefill(*upcast)
    assert got.dtype == dtype
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(got.float(), expected, atol=eps, rtol=eps)


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
    ("kernel", "window", "context", "q_len", "runs"),
    [
        ("paged", None, 45, 40, "paged"),
        ("sdpa", None, 0, 37, "sdpa"),
        ("sdpa", None, 45, 40, "sdpa"),
        ("sdpa", 20, 45, 40, "paged"),  # a window cutting keys off needs the C++ kernel
    ],
)
def test_the_chosen_prefill_kernel_serves_the_chunk(
    kernel, window, context, q_len, runs, choices, monkeypatch
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
    cache = paged_cache(torch.float32, 3, 64)
    assert_float32_close(*prefill_both((9, 64, 0.125, 3, window), cache, context, q_len))
    assert ran == [runs]


def test_a_dummy_forward_records_the_layers_prefill_problem(choices):
    impl = backend.CpuPagedImpl(9, 64, 0.125, 3, None)
    with choices.recording() as recorded:
        impl.record_kernel_problems(torch.zeros(1, 9, 64, dtype=torch.bfloat16))
    assert list(recorded) == [Problem("prefill_attention", "bfloat16", (9, 3, 64))]
    encoder = backend.CpuPagedImpl(9, 64, 0.125, 3, None, AttentionType.ENCODER_ONLY)
    with choices.recording() as recorded:
        encoder.record_kernel_problems(torch.zeros(1, 9, 64))
    assert recorded == {}  # encoder-only layers stay on the reference
