"""The flash backend's kernels against a float64 dense reference, in Triton's interpreter.

Each test runs one hand-built paged step (flash_batches) through the backend's public
pieces (builder, impl) with the kernels module swapped for a private copy interpreted
on the CPU (see tests/triton_interpreted.py), then checks the output against float64
attention over the values the batch drew, and the cache against those values placed at
their slots (bit-exact: storing is a copy). On a CUDA machine the same batches also run
compiled.
"""

from __future__ import annotations

import sys
from types import ModuleType

import pytest
import torch
from flash_batches import Batch, Layer, Request, make_batch, reference_output
from triton_interpreted import load_interpreted

pytest.importorskip("core_attn_flash", reason="core-attn-flash is not installed (optional plugin)")
# Imported here, before any TRITON_INTERPRET is set: triton decorates its own @jit helpers at
# import, and interpreted ones would break every compiled kernel later in this process.
pytest.importorskip("triton", reason="triton is not installed (the flash kernels need it)")

from core_attn_flash.backend import KERNELS_MODULE, FlashAttentionImpl  # noqa: E402
from core_attn_flash.metadata import FlashAttentionMetadataBuilder  # noqa: E402

from core.attention.interface import BuilderLimits  # noqa: E402
from core.kv_cache.spec import FullAttentionSpec  # noqa: E402

# Max |output - reference| relative to max |reference|. float32: summation order. fp16:
# the output's rounding plus P rounded to fp16 before P @ V (2^-11 each, times
# max|V| / max|out| ~ 3). bf16: the interpreter truncates the output (2^-7); compiled,
# P is rounded to bf16 too (2^-8 x ~3).
TOLERANCE = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 2e-2}
NEVER_SPLIT = 1 << 30  # split_kv_min_seq_len that keeps every step on the unified kernel
ALWAYS_SPLIT = 1  # ... that sends every decode-only step to the split-KV kernels

# Fresh prefills over a block edge, a chunk on cached context, decodes landing on and
# just past block edges, a one-token prompt, a chunk starting at a block edge.
MIXED = [
    Request(0, 20),
    Request(30, 7),
    Request(32, 1),
    Request(15, 1),
    Request(0, 1),
    Request(16, 17),
]
DECODES = [Request(40, 1), Request(15, 1), Request(0, 1), Request(70, 1)]
LONG = [Request(300, 1), Request(3, 1), Request(129, 1)]  # 19, 1 and 9 pages of 16


@pytest.fixture(scope="module")
def interpreted() -> ModuleType:
    """A private copy of `core_attn_flash.kernels` whose kernels run in the interpreter."""
    return load_interpreted(KERNELS_MODULE)


@pytest.fixture
def kernels(interpreted: ModuleType, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The interpreted copy, in sys.modules where the backend imports its kernels from."""
    monkeypatch.setitem(sys.modules, KERNELS_MODULE, interpreted)
    return interpreted


def builder_for(layer: Layer, device: str = "cpu") -> FlashAttentionMetadataBuilder:
    spec = FullAttentionSpec(
        block_size=layer.block_size,
        num_kv_heads=layer.num_kv_heads,
        head_size=layer.head_size,
        dtype=layer.dtype,
    )
    return FlashAttentionMetadataBuilder(
        spec, ["model.layers.0.self_attn.attn"], torch.device(device)
    )


def run(
    batch: Batch,
    split_kv_min_seq_len: int = NEVER_SPLIT,
    builder: FlashAttentionMetadataBuilder | None = None,
    device: str = "cpu",
) -> torch.Tensor:
    """The impl's output for `batch` (its cache is updated in place, on CPU runs)."""
    layer = batch.layer
    builder = builder or builder_for(layer, device)
    impl = FlashAttentionImpl(
        layer.num_heads,
        layer.head_size,
        layer.scale,
        layer.num_kv_heads,
        layer.sliding_window,
        split_kv_min_seq_len=split_kv_min_seq_len,
    )
    metadata = builder.build(batch.common)
    q, k, v = (t.to(device) for t in (batch.query, batch.key, batch.value))
    return impl.forward(q, k, v, batch.kv_cache.to(device), metadata).cpu()


def assert_matches_reference(batch: Batch, **run_args) -> torch.Tensor:
    expected_cache = batch.expected_cache()
    out = run(batch, **run_args)
    want = reference_output(batch)
    assert out.dtype == batch.layer.dtype and out.shape == want.shape
    error = (out.double() - want).abs().max().item()
    bound = TOLERANCE[batch.layer.dtype] * want.abs().max().item()
    assert error <= bound, f"max error {error:.3g} > {bound:.3g}"
    if run_args.get("device", "cpu") == "cpu":
        assert torch.equal(batch.storage, expected_cache), "cache differs from the slots' K/V"
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("gqa_ratio", [1, 3, 4])
def test_mixed_prefill_and_decode_step_matches_reference(kernels, dtype, gqa_ratio):
    assert_matches_reference(make_batch(Layer(dtype=dtype, gqa_ratio=gqa_ratio), MIXED))


@pytest.mark.parametrize("window", [1, 5, 17, 40])
def test_sliding_window_matches_reference(kernels, window):
    assert_matches_reference(make_batch(Layer(sliding_window=window), MIXED))


@pytest.mark.parametrize(("block_size", "head_size"), [(32, 80), (64, 16), (16, 256)])
def test_block_and_head_sizes_match_reference(kernels, block_size, head_size):
    layer = Layer(block_size=block_size, head_size=head_size, gqa_ratio=3)
    assert_matches_reference(make_batch(layer, MIXED))


@pytest.mark.parametrize("window", [None, 40])
@pytest.mark.parametrize("split_kv_min_seq_len", [NEVER_SPLIT, ALWAYS_SPLIT])
def test_decodes_over_many_pages_match_reference_on_both_paths(
    kernels, window, split_kv_min_seq_len
):
    layer = Layer(sliding_window=window, gqa_ratio=4)
    assert_matches_reference(make_batch(layer, LONG), split_kv_min_seq_len=split_kv_min_seq_len)


@pytest.mark.parametrize("split_kv_min_seq_len", [NEVER_SPLIT, ALWAYS_SPLIT])
def test_pages_left_behind_by_the_window_are_never_read(kernels, split_kv_min_seq_len):
    # A sliding-window cache may hand blocks that fell out of every window back, leaving
    # the null block in the table; its contents are undefined (NaN here).
    window = 20
    requests = [Request(100, 1), Request(90, 1), Request(3, 1)]
    batch = make_batch(Layer(sliding_window=window), requests)
    batch.storage[0] = float("nan")
    for row, request in enumerate(requests):
        first_visible = request.num_cached - window + 1
        gone = max(0, first_visible // batch.layer.block_size)  # blocks wholly before it
        batch.common.block_table[row, :gone] = 0
    out = run(batch, split_kv_min_seq_len=split_kv_min_seq_len)
    want = reference_output(batch)
    assert (out.double() - want).abs().max() <= TOLERANCE[torch.float32] * want.abs().max()


def test_chunk_over_many_cached_pages_matches_reference(kernels):
    assert_matches_reference(make_batch(Layer(), [Request(300, 70), Request(129, 1)]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_split_kv_decode_matches_reference_in_16_bit(kernels, dtype):
    batch = make_batch(Layer(dtype=dtype, gqa_ratio=3), LONG)
    assert_matches_reference(batch, split_kv_min_seq_len=ALWAYS_SPLIT)


def test_split_kv_path_runs_for_long_decode_only_steps(kernels, monkeypatch):
    calls = []
    monkeypatch.setattr(kernels, "split_kv_decode", lambda *args: calls.append(args))
    threshold = 300
    run(make_batch(Layer(), [Request(298, 1)]), split_kv_min_seq_len=threshold)  # too short
    run(make_batch(Layer(), [Request(298, 2)]), split_kv_min_seq_len=threshold)  # a chunk
    assert calls == []
    run(make_batch(Layer(), [Request(0, 0), Request(299, 1)]), split_kv_min_seq_len=threshold)
    assert len(calls) == 1


@pytest.mark.parametrize("split_kv_min_seq_len", [NEVER_SPLIT, ALWAYS_SPLIT])
def test_max_seq_len_upper_bound_gives_identical_output(kernels, split_kv_min_seq_len):
    exact = make_batch(Layer(gqa_ratio=3), DECODES)
    bounded = make_batch(Layer(gqa_ratio=3), DECODES, max_seq_len=4096)
    args = {"split_kv_min_seq_len": split_kv_min_seq_len}
    assert torch.equal(run(exact, **args), run(bounded, **args))


def test_max_query_len_upper_bound_gives_the_same_output(kernels):
    # A larger bound picks taller row tiles: the same math, possibly another summation order.
    exact = run(make_batch(Layer(gqa_ratio=3), MIXED))
    bounded = run(make_batch(Layer(gqa_ratio=3), MIXED, max_query_len=64))
    torch.testing.assert_close(bounded, exact, atol=1e-6 * exact.abs().max(), rtol=0)


@pytest.mark.parametrize(
    ("requests", "split_kv_min_seq_len"), [(MIXED, NEVER_SPLIT), (DECODES, ALWAYS_SPLIT)]
)
def test_padding_requests_and_rows_leave_cache_and_other_rows_untouched(
    kernels, requests, split_kv_min_seq_len
):
    padded_requests = [Request(0, 0), *requests[:2], Request(0, 0), *requests[2:], Request(0, 0)]
    padded = make_batch(Layer(), padded_requests, padding_tokens=3)
    # The reference has zero rows for the padding rows; the cache check covers their slots.
    out = assert_matches_reference(padded, split_kv_min_seq_len=split_kv_min_seq_len)
    assert out[-3:].count_nonzero() == 0


def test_builder_reuses_its_buffers_across_steps(kernels):
    layer = Layer()
    builder = builder_for(layer)
    builder.reserve(BuilderLimits(max_num_reqs=8, max_num_tokens=128, max_model_len=512))
    first = builder.build(make_batch(layer, MIXED, seed=1).common)
    pointers = [t.data_ptr() for t in _tensors(first)]
    second_batch = make_batch(layer, MIXED[::-1], seed=2)
    second = builder.build(second_batch.common)
    assert [t.data_ptr() for t in _tensors(second)] == pointers
    common = second_batch.common
    assert torch.equal(second.query_start_loc, common.query_start_loc)
    assert torch.equal(second.seq_lens, common.seq_lens)
    assert torch.equal(second.slot_mapping, common.slot_mapping)
    width = common.block_table.shape[1]
    assert torch.equal(second.block_table[:, :width], common.block_table)
    assert second.block_table.shape == (len(MIXED), 512 // layer.block_size)


def test_builder_copies_only_reachable_columns_of_a_wider_block_table(kernels):
    layer = Layer()
    builder = builder_for(layer)
    builder.reserve(BuilderLimits(max_num_reqs=8, max_num_tokens=128, max_model_len=64))
    reserved = builder.build(make_batch(layer, DECODES[:1]).common).block_table
    batch = make_batch(layer, DECODES[:2])
    common = batch.common
    common.block_table = torch.nn.functional.pad(common.block_table, (0, 100))  # 4 + 100 columns
    wide = builder.build(common)
    assert wide.block_table.data_ptr() == reserved.data_ptr()
    assert wide.block_table.shape == (2, 64 // layer.block_size)
    assert_matches_reference(batch, builder=builder)


def test_builder_clears_what_a_larger_earlier_step_left(kernels):
    layer = Layer()
    builder = builder_for(layer)
    builder.reserve(BuilderLimits(max_num_reqs=8, max_num_tokens=128, max_model_len=512))
    builder.build(make_batch(layer, MIXED).common)
    common = make_batch(layer, DECODES[:2]).common
    small = builder.build(common)
    assert _whole(small.seq_lens)[2:].count_nonzero() == 0
    assert (_whole(small.slot_mapping)[2:] == -1).all()
    assert (_whole(small.query_start_loc)[3:] == 2).all()  # past requests: no tokens
    assert small.block_table[:, common.block_table.shape[1] :].count_nonzero() == 0
    assert _whole(small.block_table)[small.block_table.numel() :].count_nonzero() == 0


def test_builder_without_reserve_grows_for_larger_steps(kernels):
    layer = Layer()
    builder = builder_for(layer)
    run(make_batch(layer, DECODES[:1]), builder=builder)
    assert_matches_reference(make_batch(layer, MIXED), builder=builder)
    assert_matches_reference(make_batch(layer, LONG), builder=builder)


def test_split_kv_partials_reuse_their_buffers(kernels):
    layer = Layer(gqa_ratio=3)
    builder = builder_for(layer)
    builder.reserve(BuilderLimits(max_num_reqs=8, max_num_tokens=128, max_model_len=512))
    scratch = builder.build(make_batch(layer, DECODES).common).split_kv
    first = scratch.partials(4, layer.num_heads, 16, 32)
    assert first.acc.shape == (4, layer.num_heads, 16, 32)
    assert first.maxes.shape == first.sums.shape == (4, layer.num_heads, 16)
    again = scratch.partials(8, layer.num_heads, 16, 32)  # up to the reserved requests
    assert again.acc.data_ptr() == first.acc.data_ptr()
    assert again.maxes.data_ptr() == first.maxes.data_ptr()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    ("requests", "split_kv_min_seq_len"),
    [(MIXED, NEVER_SPLIT), (LONG, NEVER_SPLIT), (LONG, ALWAYS_SPLIT)],
)
def test_compiled_kernels_match_reference_on_cuda(dtype, requests, split_kv_min_seq_len):
    for window in (None, 17):
        batch = make_batch(Layer(dtype=dtype, gqa_ratio=4, sliding_window=window), requests)
        assert_matches_reference(batch, split_kv_min_seq_len=split_kv_min_seq_len, device="cuda")


def _tensors(metadata) -> list[torch.Tensor]:
    return [
        metadata.query_start_loc,
        metadata.seq_lens,
        metadata.block_table,
        metadata.slot_mapping,
    ]


def _whole(view: torch.Tensor) -> torch.Tensor:
    """The whole buffer behind a metadata view, flat."""
    return torch.empty(0, dtype=view.dtype).set_(view.untyped_storage())
