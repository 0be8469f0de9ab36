"""The Triton AWQ GEMM against x @ dequantize(W)^T, run by Triton's CPU interpreter.

The interpreter replaces compilation when TRITON_INTERPRET=1 at the moment `@triton.jit`
decorates the kernel, so the tests load a private copy of the kernel module with the variable
set (independent of any copy already imported). On a CUDA machine the same parity checks also
run compiled, bf16 included.
"""

from __future__ import annotations

import itertools
from types import ModuleType

import pytest
import torch
from triton_interpreted import load_interpreted

awq_format = pytest.importorskip(
    "core_quant_awq.awq_format", reason="core-quant-awq is not installed (optional plugin)"
)
# Imported here, before any TRITON_INTERPRET is set: triton decorates its own @jit helpers at
# import, and interpreted ones would break every compiled kernel later in this process.
pytest.importorskip("triton", reason="triton is not installed (the AWQ GPU kernel needs it)")

# The interpreter keeps bf16 as raw uint16 bits: dot products and int -> bf16 casts on them
# are wrong, so bf16 is only checked compiled, on a GPU.
BF16_INTERPRETED = pytest.param(
    torch.bfloat16,
    marks=pytest.mark.skip(reason="the Triton interpreter cannot compute on bfloat16"),
)
INTERPRETED_DTYPES = [torch.float32, torch.float16, BF16_INTERPRETED]
FP32_SUM_ORDER = 1e-4  # relative to max(|x| @ |W|^T): fp32 summation order, several splits


@pytest.fixture(scope="module")
def interpreted() -> ModuleType:
    """A private copy of `core_quant_awq.triton_awq` whose kernel runs in the interpreter."""
    return load_interpreted("core_quant_awq.triton_awq")


def _awq_layer(in_features, out_features, group_size, device="cpu", seed=0):
    """Random AutoAWQ tensors (qweight, qzeros, scales) for W [out_features, in_features]."""
    gen = torch.Generator().manual_seed(seed)
    num_groups = in_features // group_size
    q = torch.randint(0, 16, (in_features, out_features), generator=gen)
    zeros = torch.randint(0, 16, (num_groups, out_features), generator=gen)
    scales = (torch.rand(num_groups, out_features, generator=gen) * 0.02 + 0.001).half()
    layer = (awq_format.pack_columns(q), awq_format.pack_columns(zeros), scales)
    return tuple(t.to(device) for t in layer)


def _activations(num_tokens, in_features, dtype, device="cpu", seed=1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(num_tokens, in_features, generator=gen).to(device=device, dtype=dtype)


def _assert_matches_reference(y, x, qweight, qzeros, scales):
    """Within fp32 summation order plus one rounding to y's dtype of the fp32 reference."""
    w = awq_format.dequantize(qweight, qzeros, scales)  # [N, K] float32
    ref = x.float() @ w.T  # [M, N]
    magnitude = (x.float().abs() @ w.abs().T).max()
    bound = FP32_SUM_ORDER * magnitude + torch.finfo(x.dtype).eps / 2 * ref.abs()
    assert y.dtype == x.dtype
    assert y.shape == ref.shape
    excess = (y.float() - ref).abs() - bound
    assert (excess <= 0).all(), f"exceeds the bound by up to {excess.max().item():.3g}"


def _check_gemm(module, num_tokens, in_features, group_size, out_features, dtype, config=None):
    qweight, qzeros, scales = _awq_layer(in_features, out_features, group_size)
    x = _activations(num_tokens, in_features, dtype)
    y = module.awq_gemm(x, qweight, qzeros, scales, group_size, config=config)
    _assert_matches_reference(y, x, qweight, qzeros, scales)


# (M, K, G, N): a decode row split over K, odd token counts on both sides of the decode limit,
# several groups per K range, N short of one tile and past it.
FAST_SHAPES = [(1, 256, 128, 40), (3, 128, 32, 72), (17, 64, 32, 8), (17, 256, 64, 72)]
GROUPED_K = [(64, 32), (64, 64), (128, 32), (128, 64), (128, 128), (256, 32), (256, 64)]
ALL_SHAPES = [
    (m, k, g, n)
    for m, (k, g), n in itertools.product((1, 3, 17), GROUPED_K + [(256, 128)], (8, 40, 72))
    if (m, k, g, n) not in FAST_SHAPES
]


@pytest.mark.parametrize("dtype", INTERPRETED_DTYPES)
@pytest.mark.parametrize(("num_tokens", "in_features", "group_size", "out_features"), FAST_SHAPES)
def test_gemm_matches_dequantized_reference(
    interpreted, num_tokens, in_features, group_size, out_features, dtype
):
    _check_gemm(interpreted, num_tokens, in_features, group_size, out_features, dtype)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", INTERPRETED_DTYPES)
@pytest.mark.parametrize(("num_tokens", "in_features", "group_size", "out_features"), ALL_SHAPES)
def test_gemm_matches_dequantized_reference_on_all_small_shapes(
    interpreted, num_tokens, in_features, group_size, out_features, dtype
):
    _check_gemm(interpreted, num_tokens, in_features, group_size, out_features, dtype)


@pytest.mark.parametrize(
    ("field_values", "num_tokens"),
    [
        ({"block_k": 32}, 3),  # one group of 128 spans four K steps
        ({"block_k": 16, "split_k": 3}, 3),  # 16 K steps over 3 splits: the last one is short
        ({"block_k": 64, "split_k": 5}, 1),  # 4 K steps over 5 splits: one split has none
        ({"block_m": 16}, 17),  # a second row tile holding one token
        ({"block_n": 16}, 5),  # the last column tile holds 8 of 16 outputs
    ],
)
def test_gemm_is_exact_under_forced_tilings(interpreted, field_values, num_tokens):
    fields = {"block_m": 64, "block_n": 64, "block_k": 64, **field_values}
    config = interpreted.AwqGemmConfig(**fields)
    _check_gemm(interpreted, num_tokens, 256, 128, 40, torch.float32, config=config)


def test_gemm_reads_strided_activations(interpreted):
    qweight, qzeros, scales = _awq_layer(128, 40, 64)
    wide = _activations(3, 256, torch.float32)
    x = wide[:, ::2]  # [3, 128], stride 2 along K
    y = interpreted.awq_gemm(x, qweight, qzeros, scales, 64)
    _assert_matches_reference(y, x, qweight, qzeros, scales)


def test_decode_config_splits_k_and_prefill_does_not(interpreted):
    decode = interpreted.select_config(1, 576, 576, 64)
    prefill = interpreted.select_config(17, 576, 576, 64)
    assert (decode.block_m, decode.split_k) == (16, 9)  # 9 column tiles x 9 K steps of 64
    assert (prefill.block_m, prefill.split_k) == (64, 1)


@pytest.mark.parametrize(("group_size", "block_k"), [(32, 32), (96, 32), (128, 128), (256, 128)])
def test_config_keeps_each_k_step_inside_one_group(interpreted, group_size, block_k):
    assert interpreted.select_config(1, 64, 768, group_size).block_k == block_k


def test_config_rejects_groups_smaller_than_a_dot_tile(interpreted):
    with pytest.raises(ValueError, match="group_size 8 must be a multiple of 16"):
        interpreted.select_config(1, 64, 128, 8)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"group_size": 48}, "group_size 48 does not divide"),
        ({"scales": torch.zeros(2, 32, dtype=torch.half)}, "scales shape"),
        ({"qzeros": torch.zeros(2, 8, dtype=torch.int32)}, "qzeros shape"),
        ({"x": torch.zeros(1, 64)}, "x has 64 features"),
        ({"config_block_k": 128}, "config.block_k = 128 must divide group_size 64"),
        ({"config_block_k": 24}, "config.block_k = 24 must be a power of two"),
    ],
)
def test_gemm_rejects_mismatched_inputs_naming_them(interpreted, change, message):
    qweight, qzeros, scales = _awq_layer(128, 40, 64)
    args = {"x": torch.zeros(1, 128), "qweight": qweight, "qzeros": qzeros, "scales": scales}
    args["group_size"] = 64
    block_k = change.pop("config_block_k", None)
    args.update(change)
    config = None if block_k is None else interpreted.AwqGemmConfig(64, 64, block_k)
    with pytest.raises(ValueError, match=message):
        interpreted.awq_gemm(**args, config=config)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("group_size", [32, 128])
@pytest.mark.parametrize("num_tokens", [1, 5, 17, 300])
def test_compiled_gemm_matches_dequantized_reference_on_cuda(num_tokens, group_size, dtype):
    from core_quant_awq.triton_awq import awq_gemm

    qweight, qzeros, scales = _awq_layer(1024, 1032, group_size, device="cuda")
    x = _activations(num_tokens, 1024, dtype, device="cuda")
    y = awq_gemm(x, qweight, qzeros, scales, group_size)
    _assert_matches_reference(y, x, qweight, qzeros, scales)
