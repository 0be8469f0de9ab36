"""The C++ decode kernel against the reference backend's decode, and its selection."""

from __future__ import annotations

import importlib.metadata as metadata

import pytest
import torch

from core.attention.backends.torch_ref import TorchRefImpl
from core.attention.interface import AttentionRequirements
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


def paged_cache(dtype: torch.dtype, kv_heads: int, head_size: int, layout: str) -> torch.Tensor:
    """A random cache; "block_outermost" interleaves two layers so pages are strided."""
    page = (2, BLOCK_SIZE, kv_heads, head_size)
    page_bytes = torch.Size(page).numel() * dtype.itemsize
    tensor = getattr(KVCacheTensor, layout)(("other", "this"), NUM_BLOCKS, page_bytes)
    buffer = torch.zeros(tensor.size, dtype=torch.int8)
    cache = create_kv_cache_view(buffer, tensor, "this", NUM_BLOCKS, page, dtype)
    cache.copy_(torch.randn(cache.shape, generator=torch.Generator().manual_seed(0)))
    return cache


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
    cache = paged_cache(torch.float32, kv_heads, head_size, layout)
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
    cache = paged_cache(dtype, kv_heads, head_size, layout)
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


def test_bad_inputs_are_refused_with_the_reason():
    cache = paged_cache(torch.float32, 3, 64, "layer_outermost")
    batch = decode_batch([5, 6])
    impl = backend.CpuPagedImpl(9, 64, 0.125, 3)
    with pytest.raises(RuntimeError, match="kv_cache dtype must match query"):
        impl.forward_decode(torch.randn(2, 9, 64, dtype=torch.bfloat16), cache, batch)
    with pytest.raises(RuntimeError, match="head sizes of query and kv_cache differ"):
        impl.forward_decode(torch.randn(2, 9, 32), cache, batch)


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


def test_without_the_plugin_the_cpu_platform_falls_back_to_the_reference():
    points = [ep for g in ALL_GROUPS for ep in metadata.entry_points(group=g)]
    registry = PluginRegistry(points, allowlist=["core-cuda"])  # core-cpu-kernels filtered out
    choice = select_attention_backend(CpuPlatform(), requirements(64), registry=registry)
    assert choice.name == "torch_ref"
    assert "cpu_paged" in choice.rejected
