"""The C++ decode kernels (paged attention, multi-head latent attention) against the
reference backends' decode hooks, and their selection; paged attention also over FP8
caches (--kv-cache-dtype), against the reference reading the same cache."""

from __future__ import annotations

import importlib.metadata as metadata

import pytest
import torch
from fp8_caches import FP8, SCALES, finite_values, store_fp8
from torch import nn

from core.attention.backends.mla_ref import TorchRefMLAImpl
from core.attention.backends.torch_ref import TorchRefImpl
from core.attention.interface import AttentionRequirements, MLADims
from core.attention.kv_cache_dtype import FP8_KV_CACHE_DTYPES
from core.attention.paged_metadata import DecodeBatch
from core.attention.selector import select_attention_backend
from core.kv_cache.layout import KVCacheTensor, create_kv_cache_view
from core.platforms.cpu import CpuPlatform
from core.plugins import PluginRegistry
from core.plugins.groups import ALL_GROUPS

backend = pytest.importorskip(
    "core_cpu_kernels.backend", reason="core-cpu-kernels is not installed (optional plugin)"
)

NUM_BLOCKS, BLOCK_SIZE = 40, 16
SEQ_LENS = [1, 15, 16, 17, 33, 100, 200]  # block edges, partial blocks, many blocks


def paged_cache(dtype: torch.dtype, page: tuple[int, ...], layout: str) -> torch.Tensor:
    """A random cache of pages shaped `page`; "block_outermost" interleaves two layers so
    pages are strided."""
    page_bytes = torch.Size(page).numel() * dtype.itemsize
    tensor = getattr(KVCacheTensor, layout)(("other", "this"), NUM_BLOCKS, page_bytes)
    buffer = torch.zeros(tensor.size, dtype=torch.int8)
    cache = create_kv_cache_view(buffer, tensor, "this", NUM_BLOCKS, page, dtype)
    cache.copy_(torch.randn(cache.shape, generator=torch.Generator().manual_seed(0)))
    return cache


def kv_page(kv_heads: int, head_size: int) -> tuple[int, ...]:
    """The reference's page: K then V of each token of a block."""
    return (2, BLOCK_SIZE, kv_heads, head_size)


def decode_batch(seq_lens: list[int]) -> DecodeBatch:
    """Each sequence gets distinct, shuffled blocks (as a long-running pool hands out)."""
    num_blocks = -(-max(seq_lens) // BLOCK_SIZE)
    order = torch.randperm(NUM_BLOCKS, generator=torch.Generator().manual_seed(1))
    table = torch.stack([order.roll(7 * i)[:num_blocks] for i in range(len(seq_lens))])
    return DecodeBatch(
        token_index=torch.arange(len(seq_lens)),
        block_table=table,
        seq_lens=torch.tensor(seq_lens),
        key_positions=torch.arange(num_blocks * BLOCK_SIZE)[None, :],
    )


@pytest.mark.parametrize("layout", ["layer_outermost", "block_outermost"])
@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_size", "window"),
    [(9, 3, 64, None), (4, 4, 128, None), (8, 2, 16, 20), (6, 1, 80, 5)],
)
def test_float32_decode_matches_the_reference(layout, heads, kv_heads, head_size, window):
    cache = paged_cache(torch.float32, kv_page(kv_heads, head_size), layout)
    batch = decode_batch(SEQ_LENS)
    q = torch.randn(len(SEQ_LENS), heads, head_size, generator=torch.Generator().manual_seed(2))
    args = (heads, head_size, head_size**-0.5, kv_heads, window)
    expected = TorchRefImpl(*args).forward_decode(q, cache, batch)
    got = backend.CpuPagedImpl(*args).forward_decode(q, cache, batch)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_size", "window", "layout"),
    [
        (9, 3, 64, None, "layer_outermost"),
        (4, 4, 128, None, "layer_outermost"),
        (8, 2, 16, None, "layer_outermost"),
        (6, 1, 80, None, "layer_outermost"),
        (16, 1, 64, 20, "block_outermost"),
        (6, 2, 96, 5, "layer_outermost"),
        (4, 2, 256, None, "block_outermost"),
        (8, 8, 32, 33, "layer_outermost"),
    ],
)
def test_half_precision_decode_matches_the_reference_in_float32(
    dtype, heads, kv_heads, head_size, window, layout
):
    # Head sizes below, at and between whole vectors of bf16 pairs (AVX512_BF16's 32); GQA
    # groups smaller and larger than the query heads the bf16 kernel sums in one pass over
    # the values (6 at D 64, 1 at D 256), and windows that start inside a tile of 16 keys.
    cache = paged_cache(dtype, kv_page(kv_heads, head_size), layout)
    batch = decode_batch(SEQ_LENS)
    shape = (len(SEQ_LENS), heads, head_size)
    q = torch.randn(shape, generator=torch.Generator().manual_seed(2)).to(dtype)
    args = (heads, head_size, head_size**-0.5, kv_heads, window)
    # The kernel accumulates in float32, so compare with the reference run in float32.
    expected = TorchRefImpl(*args).forward_decode(q.float(), cache.float(), batch)
    got = backend.CpuPagedImpl(*args).forward_decode(q, cache, batch)
    assert got.dtype == dtype
    tolerance = 2 * torch.finfo(dtype).eps
    torch.testing.assert_close(got.float(), expected, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("kv_cache_dtype", FP8)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_size", "window", "layout"),
    [
        (9, 3, 64, None, "layer_outermost"),
        (8, 2, 16, 20, "block_outermost"),
        (4, 4, 128, None, "layer_outermost"),
        (6, 1, 80, 5, "block_outermost"),
    ],
)
def test_fp8_decode_matches_the_reference_reading_the_same_cache(
    kv_cache_dtype, dtype, heads, kv_heads, head_size, window, layout
):
    # GQA groups of 3, 4, 1 and 6, windows inside a block and across one, strided pages.
    cache = paged_cache(FP8_KV_CACHE_DTYPES[kv_cache_dtype], kv_page(kv_heads, head_size), layout)
    store_fp8(cache, SCALES)
    batch = decode_batch(SEQ_LENS)
    shape = (len(SEQ_LENS), heads, head_size)
    q = torch.randn(shape, generator=torch.Generator().manual_seed(2)).to(dtype)
    args = (heads, head_size, head_size**-0.5, kv_heads, window)
    got = backend.CpuPagedImpl(*args, kv_scales=SCALES).forward_decode(q, cache, batch)
    # The reference dequantizes in the query's dtype; the kernel in float32, so compare with
    # the reference run in float32.
    expected = TorchRefImpl(*args, kv_scales=SCALES).forward_decode(q.float(), cache, batch)
    assert got.dtype == dtype
    if dtype is torch.float32:  # K/V up to 126 in magnitude: scores of up to ~1e3
        tolerance = 1e-5 * expected.abs().max().item()
        torch.testing.assert_close(got, expected, atol=tolerance, rtol=1e-5)
    else:
        tolerance = 2 * torch.finfo(dtype).eps
        torch.testing.assert_close(got.float(), expected, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize(
    ("dtype", "kv_cache_dtype"),
    [(torch.float32, None), (torch.bfloat16, None), (torch.float16, None),
     (torch.float32, "fp8_e4m3"), (torch.bfloat16, "fp8_e5m2")],
    ids=["float32", "bfloat16", "float16", "fp8_e4m3", "fp8_e5m2"],
)  # fmt: skip
@pytest.mark.parametrize(("heads", "kv_heads", "head_size"), [(9, 3, 64), (8, 2, 16), (6, 1, 80)])
def test_a_sequence_alone_gets_the_bits_it_gets_in_a_batch(
    dtype, kv_cache_dtype, heads, kv_heads, head_size
):
    # Alone, a sequence's GQA groups are split between the threads; in a batch of more
    # sequences than threads, each sequence is one thread's. Its output must not tell.
    page = kv_page(kv_heads, head_size)
    if kv_cache_dtype is None:
        cache, scales = paged_cache(dtype, page, "layer_outermost"), None
    else:
        cache = paged_cache(FP8_KV_CACHE_DTYPES[kv_cache_dtype], page, "layer_outermost")
        store_fp8(cache, SCALES)
        scales = SCALES
    impl = backend.CpuPagedImpl(heads, head_size, head_size**-0.5, kv_heads, None, kv_scales=scales)
    q = torch.randn(len(SEQ_LENS), heads, head_size, generator=torch.Generator().manual_seed(2))
    q = q.to(dtype)
    batch = decode_batch(SEQ_LENS)
    together = impl.forward_decode(q, cache, batch)
    for i in range(len(SEQ_LENS)):
        alone = DecodeBatch(
            token_index=torch.arange(1), block_table=batch.block_table[i : i + 1],
            seq_lens=batch.seq_lens[i : i + 1], key_positions=batch.key_positions,
        )  # fmt: skip
        assert torch.equal(impl.forward_decode(q[i : i + 1], cache, alone), together[i : i + 1])


@pytest.mark.parametrize("kv_cache_dtype", FP8)
def test_every_finite_fp8_value_reads_as_torchs_times_the_scale(kv_cache_dtype):
    # One key: its weight is exactly 1, so the output is the value row read, times v_scale.
    dtype = FP8_KV_CACHE_DTYPES[kv_cache_dtype]
    cache = paged_cache(dtype, kv_page(1, 256), "layer_outermost")
    values = finite_values(dtype, 256)  # subnormals, normals, the largest, signed zeros
    batch = decode_batch([1])
    cache[batch.block_table[0, 0], 1, 0, 0] = values
    impl = backend.CpuPagedImpl(2, 256, 0.0625, 1, kv_scales=SCALES)
    got = impl.forward_decode(torch.randn(1, 2, 256), cache, batch)
    expected = values.float() * SCALES.v_scale
    torch.testing.assert_close(got[0], expected.expand(2, -1), rtol=0, atol=0)


def test_bad_inputs_are_refused_with_the_reason():
    cache = paged_cache(torch.float32, kv_page(3, 64), "layer_outermost")
    batch = decode_batch([5, 6])
    impl = backend.CpuPagedImpl(9, 64, 0.125, 3)
    with pytest.raises(RuntimeError, match="kv_cache dtype must match query"):
        impl.forward_decode(torch.randn(2, 9, 64, dtype=torch.bfloat16), cache, batch)
    with pytest.raises(RuntimeError, match="head sizes of query and kv_cache differ"):
        impl.forward_decode(torch.randn(2, 9, 32), cache, batch)
    query, out = torch.randn(2, 9, 64), torch.empty(2, 9, 64)
    call = (out, query, cache, batch.block_table, batch.seq_lens, 0.125, 0)
    with pytest.raises(RuntimeError, match="scale an FP8 cache only"):
        backend._C.paged_decode_attention(*call, k_scale=0.5, v_scale=1.0)
    with pytest.raises(RuntimeError, match="k_scale and v_scale must be positive"):
        backend._C.paged_decode_attention(*call[:2], cache.to(torch.float8_e4m3fn), *call[3:],
                                          k_scale=0.0, v_scale=1.0)  # fmt: skip


# DeepSeek-V2's latent (512 + 64), the tiny test models' (16 + 8), and sizes that are not
# whole vectors of 8 lanes (rank 12, latent 18).
MLA_SIZES = {
    "deepseek_v2": MLADims(kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                           v_head_dim=128),
    "tiny": MLADims(kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12),
    "odd": MLADims(kv_lora_rank=12, qk_nope_head_dim=4, qk_rope_head_dim=6, v_head_dim=4),
}  # fmt: skip


def mla_decode(
    kernel: bool, dims: MLADims, query: torch.Tensor, cache: torch.Tensor, batch: DecodeBatch
) -> torch.Tensor:  # query [B, H, L] (absorbed) -> [B, H, R]
    """The decode hook of the C++ impl (kernel) or of the reference, at DeepSeek's scale."""
    heads = query.shape[1]
    # The decode hook attends over latents only: kv_b_proj is never called.
    kv_b_proj = nn.Linear(dims.kv_lora_rank, heads * (dims.qk_nope_head_dim + dims.v_head_dim))
    scale = (dims.qk_nope_head_dim + dims.qk_rope_head_dim) ** -0.5
    cls = backend.CpuPagedMLAImpl if kernel else TorchRefMLAImpl
    impl = cls(heads, dims.latent_size, scale, 1, mla=dims, kv_b_proj=kv_b_proj)
    return impl.forward_decode(query, cache, batch)


@pytest.mark.parametrize("layout", ["layer_outermost", "block_outermost"])
@pytest.mark.parametrize("heads", [1, 16])
@pytest.mark.parametrize("size", sorted(MLA_SIZES))
def test_float32_mla_decode_matches_the_reference(layout, heads, size):
    dims = MLA_SIZES[size]
    cache = paged_cache(torch.float32, (BLOCK_SIZE, dims.latent_size), layout)
    batch = decode_batch(SEQ_LENS)
    shape = (len(SEQ_LENS), heads, dims.latent_size)
    q = torch.randn(shape, generator=torch.Generator().manual_seed(2))

    got = mla_decode(True, dims, q, cache, batch)

    assert got.shape == (len(SEQ_LENS), heads, dims.kv_lora_rank)
    expected = mla_decode(False, dims, q, cache, batch)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("heads", "size"), [(16, "deepseek_v2"), (1, "tiny"), (16, "odd")])
def test_half_precision_mla_decode_matches_the_reference_in_float32(dtype, heads, size):
    dims = MLA_SIZES[size]
    cache = paged_cache(dtype, (BLOCK_SIZE, dims.latent_size), "layer_outermost")
    batch = decode_batch(SEQ_LENS)
    shape = (len(SEQ_LENS), heads, dims.latent_size)
    q = torch.randn(shape, generator=torch.Generator().manual_seed(2)).to(dtype)

    got = mla_decode(True, dims, q, cache, batch)

    assert got.dtype == dtype
    # The kernel accumulates in float32, so compare with the reference run in float32.
    expected = mla_decode(False, dims, q.float(), cache.float(), batch)
    tolerance = 2 * torch.finfo(dtype).eps
    torch.testing.assert_close(got.float(), expected, atol=tolerance, rtol=tolerance)


def requirements(head_size: int) -> AttentionRequirements:
    return AttentionRequirements(dtype=torch.float32, head_size=head_size, block_size=16)


def test_the_cpu_platform_prefers_the_kernel_when_installed():
    points = [ep for g in ALL_GROUPS for ep in metadata.entry_points(group=g)]
    registry = PluginRegistry(points, None)
    assert select_attention_backend(CpuPlatform(), requirements(64), registry=registry).name == (
        "cpu_paged"
    )
    # A head size the kernel is not compiled for falls back to the reference, with a reason.
    choice = select_attention_backend(CpuPlatform(), requirements(48), registry=registry)
    assert choice.name == "torch_ref"
    assert "head size 48" in choice.rejected["cpu_paged"]
    # Multi-head latent attention layers get the family's MLA backend, at any latent size.
    mla = AttentionRequirements(torch.float32, head_size=24, block_size=16, use_mla=True)
    choice = select_attention_backend(CpuPlatform(), mla, registry=registry)
    assert (choice.name, choice.backend) == ("cpu_paged", backend.CpuPagedMLABackend)


def test_without_the_plugin_the_cpu_platform_falls_back_to_the_reference():
    points = [ep for g in ALL_GROUPS for ep in metadata.entry_points(group=g)]
    registry = PluginRegistry(points, allowlist=["core-cuda"])  # core-cpu-kernels filtered out
    choice = select_attention_backend(CpuPlatform(), requirements(64), registry=registry)
    assert choice.name == "torch_ref"
    assert "cpu_paged" in choice.rejected
