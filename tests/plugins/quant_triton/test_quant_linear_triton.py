"""core-quant-triton's quant_linear kernel against core's reference, in Triton's interpreter.

Each test runs `quant_linear_triton` with its kernels module swapped for a private copy
interpreted on the CPU (see tests/triton_interpreted.py) and checks the output against
`quant_linear_reference` with the op's tolerances. On a CUDA machine the kernel also runs
compiled, and everywhere it compiles for GPU targets without a GPU (the interpreter
forgives what the compiler does not: a tile under tl.dot's 16, shared memory over the
device's).
"""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest
import torch
from triton_interpreted import (
    GPU_TARGETS,
    assert_matches,
    compiles_within_shared_memory,
    load_interpreted,
)

pytest.importorskip(
    "core_quant_triton", reason="core-quant-triton is not installed (optional plugin)"
)
# Imported here, before any TRITON_INTERPRET is set: triton decorates its own @jit helpers at
# import, and interpreted ones would break every compiled kernel later in this process.
triton = pytest.importorskip("triton", reason="triton is not installed (the kernel needs it)")

from core_quant_triton.ops import (  # noqa: E402
    KERNELS_MODULE,
    PROVIDER,
    Tiles,
    choose_tiles,
    quant_linear_triton,
    register,
)

from core.ops import CORE_OPS, provider, quant_linear_reference  # noqa: E402
from core.ops.quant_linear import TOLERANCES, _quant_linear_samples, pack  # noqa: E402

Args = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]

# The largest tiles choose_tiles picks for decode and for prefill.
TILINGS = {
    "decode": choose_tiles(1, 4096, 4096, 128),
    "prefill": choose_tiles(512, 4096, 4096, 128),
}


@pytest.fixture(scope="module")
def kernels() -> ModuleType:
    """A private copy of `core_quant_triton.kernels` whose kernel runs in the interpreter."""
    return load_interpreted(KERNELS_MODULE)


def make_args(
    rows: int,
    outputs: int,
    inputs: int,
    bits: int,
    group: int,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> Args:
    """Random x and a packed weight: values over their whole range, and mins of either
    sign independent of the scales (as GGUF's Q4_1 / Q4_K blocks have)."""
    generator = torch.Generator().manual_seed(seed)
    low, high = (0, 16) if bits == 4 else (-128, 128)
    q = torch.randint(low, high, (outputs, inputs), generator=generator)
    scales = torch.rand(outputs, inputs // group, generator=generator) * 0.02 + 1e-3
    mins = torch.randn(outputs, inputs // group, generator=generator) * 0.1
    x = torch.randn(rows, inputs, generator=generator).to(dtype)
    return x, pack(q, bits), scales, mins, bits


def assert_matches_reference(
    kernels: ModuleType, args: Args, tiles: Tiles | None = None
) -> torch.Tensor:
    out = quant_linear_triton(*args, kernels=kernels, tiles=tiles)
    assert_matches(out, quant_linear_reference(*args), TOLERANCES)
    return out


@pytest.mark.parametrize("dtype", DTYPES)
def test_interpreted_kernel_matches_reference_on_every_conformance_sample(kernels, dtype):
    for sample in _quant_linear_samples(dtype, torch.device("cpu")):
        out = quant_linear_triton(*sample.args, kernels=kernels)
        assert_matches(out, quant_linear_reference(*sample.args), TOLERANCES, sample.name)


# (bits, inputs, group): each group size core's formats use, and one group per row of a
# size that is no power of two (its K steps are its largest power-of-two divisor).
GROUPS = [
    (4, 256, 32),
    (4, 256, 64),
    (4, 256, 128),
    (4, 160, 160),
    (8, 128, 16),
    (8, 256, 32),
    (8, 256, 128),
    (8, 80, 80),
]


@pytest.mark.parametrize(("bits", "inputs", "group"), GROUPS)
def test_group_sizes_match_reference(kernels, bits, inputs, group):
    assert_matches_reference(kernels, make_args(3, 24, inputs, bits, group, seed=group))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 3, 17, 64])
@pytest.mark.parametrize("bits", [4, 8])
def test_row_counts_and_dtypes_match_reference(kernels, bits, rows, dtype):
    assert_matches_reference(kernels, make_args(rows, 40, 128, bits, 64, dtype, seed=rows))


@pytest.mark.parametrize(
    ("args", "tiles"),
    [
        # 5 K steps over 3 splits (2, 2, 1): K = 160 is no multiple of 32 x 3.
        (make_args(2, 24, 160, 4, 32), Tiles(16, 16, 32, split_k=3)),
        # 8 steps of 32 over 3 splits (3, 3, 2), 4 steps a group: splits cross groups.
        (make_args(1, 24, 256, 4, 128), Tiles(16, 32, 32, split_k=3)),
        # 9 steps over 4 splits (3, 3, 3, 0): the last split has none and adds zeros.
        (make_args(3, 8, 144, 8, 48), Tiles(16, 16, 16, split_k=4)),
        # A second row tile of one row; 40 outputs in tiles of 16, the last one part full.
        (make_args(17, 40, 64, 8, 32), Tiles(16, 16, 16)),
        (make_args(17, 40, 64, 4, 64, dtype=torch.bfloat16), Tiles(16, 16, 32, split_k=2)),
    ],
    ids=["uneven-splits", "splits-across-groups", "empty-split", "edge-tiles", "bf16-split"],
)
def test_forced_tilings_match_reference(kernels, args, tiles):
    assert_matches_reference(kernels, args, tiles)


@pytest.mark.parametrize("bits", [4, 8])
def test_strided_tensors_match_reference(kernels, bits):
    x, qweight, scales, mins, _ = make_args(5, 24, 128, bits, 32)
    wide_x = torch.cat([x, x], dim=1)[:, ::2]  # rows of stride 2K, columns of 2
    # The first 128 inputs of a wider weight: rows of qweight longer than their values.
    wide = make_args(1, 24, 256, bits, 32, seed=1)
    qweight_view = wide[1][:, : qweight.shape[1]]
    scales_t = scales.t().contiguous().t()  # column-major [N, K / G]
    mins_view = torch.cat([mins, mins], dim=1)[:, ::2]
    assert_matches_reference(kernels, (wide_x, qweight_view, scales_t, mins_view, bits))


def test_decode_splits_k_and_prefill_does_not():
    decode = choose_tiles(1, 4096, 4096, 128)
    prefill = choose_tiles(512, 4096, 4096, 128)
    # 64 column tiles: 4 splits of 8 steps of 128 make 256 programs.
    assert decode == Tiles(block_m=16, block_n=64, block_k=128, split_k=4)
    assert prefill == Tiles(block_m=64, block_n=64, block_k=64, split_k=1)


@pytest.mark.parametrize(
    ("group", "block_k"), [(16, 16), (32, 32), (96, 32), (160, 32), (256, 128)]
)
def test_each_k_step_lies_inside_one_group(group, block_k):
    assert choose_tiles(1, 64, group * 4, group).block_k == block_k


def test_splits_share_k_evenly_with_none_empty():
    # 30 column tiles leave room for 8 splits of 20 steps, 3 steps each: the eighth would
    # have none, so the steps go to 7 splits.
    assert choose_tiles(1, 1920, 640, 32) == Tiles(16, 64, 32, split_k=7)


def test_inputs_the_kernel_does_not_take_go_to_the_reference():
    x, qweight, scales, mins, bits = make_args(3, 8, 64, 4, 32)
    # No kernels module: touching one would raise AttributeError.
    cases = [
        (x.double(), qweight, scales, mins, bits),  # a dtype the kernel does not take
        (x, qweight, scales.half(), mins.half(), bits),  # not core's packed layout
        (x[:0], qweight, scales, mins, bits),  # no rows: no launch grid
    ]
    for args in cases:
        out = quant_linear_triton(*args, kernels=object())
        assert torch.equal(out, quant_linear_reference(*args))
    with pytest.raises(RuntimeError):  # 32 inputs against 64: the reference's error
        quant_linear_triton(x[:, :32], qweight, scales, mins, bits, kernels=object())


def test_register_serves_quant_linear_on_cuda():
    # Registration is re-entrant, so this holds after any earlier test registered it too.
    served = CORE_OPS.registrations_of(register)
    assert [(op.name, device_type) for op, device_type in served] == [("quant_linear", "cuda")]
    register()
    assert provider("quant_linear", "cuda") == PROVIDER


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", DTYPES)
def test_compiled_kernel_matches_reference_on_cuda(dtype):
    cases = [sample.args for sample in _quant_linear_samples(dtype, torch.device("cpu"))]
    for bits, group in [(4, 128), (8, 32)]:
        cases += [make_args(rows, 576, 1024, bits, group, dtype) for rows in (1, 7, 300)]
    for args in cases:
        out = quant_linear_triton(*(a.cuda() if isinstance(a, torch.Tensor) else a for a in args))
        assert_matches(out, quant_linear_reference(*args), TOLERANCES)


@pytest.mark.skipif(
    triton.knobs.runtime.interpret, reason="TRITON_INTERPRET is set: the kernel is not compiled"
)
@pytest.mark.parametrize("target", GPU_TARGETS)
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("tiling", TILINGS)
def test_kernel_compiles_for_gpu_target_within_shared_memory(tiling, bits, dtype, target):
    kernel = importlib.import_module(KERNELS_MODULE)._quant_gemm_kernel
    tiles = TILINGS[tiling]
    constexprs = dict(
        BITS=bits, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, UPCAST=False
    )
    pointers = {
        "out_ptr": "*fp32" if tiles.split_k > 1 else f"*{dtype}",
        "x_ptr": f"*{dtype}",
        "qweight_ptr": "*u8" if bits == 4 else "*i8",
        "scales_ptr": "*fp32",
        "mins_ptr": "*fp32",
    }
    assert compiles_within_shared_memory(kernel, constexprs, pointers.__getitem__, target)
