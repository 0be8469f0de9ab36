"""The C++ RMSNorm kernels against core's references, and their registration."""

from __future__ import annotations

import pytest
import torch

from core.ops import fused_add_rms_norm_reference, rms_norm_reference

ops = pytest.importorskip(
    "core_cpu_kernels.ops", reason="core-cpu-kernels is not installed (optional plugin)"
)

EPS = 1e-6
HIDDEN_SIZES = [1, 7, 576, 1000]  # a single element, odd, SmolLM2's, past a vector multiple
NUM_ROWS = [1, 37]  # a decode row; many rows (more than one thread's share at 1000)
# Versus a float32 reference on the same (rounded) inputs: float32 differs only in the
# order of the sum of squares; half types round the normalized row and the product.
TOLERANCES = {torch.float32: 1e-6, torch.bfloat16: 1.6e-2, torch.float16: 2e-3}


def _inputs(shape, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen) * 3).to(dtype)


def _assert_near_reference(got: torch.Tensor, want32: torch.Tensor, dtype: torch.dtype):
    assert got.dtype == dtype and got.shape == want32.shape
    tol = TOLERANCES[dtype]
    torch.testing.assert_close(got.float(), want32, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", sorted(TOLERANCES, key=str))
@pytest.mark.parametrize("hidden", HIDDEN_SIZES)
@pytest.mark.parametrize("num_rows", NUM_ROWS)
def test_rms_norm_matches_the_float32_reference(dtype, hidden, num_rows):
    x, weight = _inputs((num_rows, hidden), dtype), _inputs(hidden, dtype, seed=1)
    want = rms_norm_reference(x.float(), weight.float(), EPS)
    _assert_near_reference(ops.rms_norm(x, weight, EPS), want, dtype)


@pytest.mark.parametrize("dtype", sorted(TOLERANCES, key=str))
@pytest.mark.parametrize("hidden", HIDDEN_SIZES)
@pytest.mark.parametrize("num_rows", NUM_ROWS)
def test_fused_add_rms_norm_matches_the_float32_reference(dtype, hidden, num_rows):
    x, residual = _inputs((num_rows, hidden), dtype), _inputs((num_rows, hidden), dtype, seed=2)
    weight = _inputs(hidden, dtype, seed=1)
    normed, new_residual = ops.fused_add_rms_norm(x, residual, weight, EPS)
    assert torch.equal(new_residual, x + residual)  # one rounding of the sum, as torch's
    want = rms_norm_reference(new_residual.float(), weight.float(), EPS)
    _assert_near_reference(normed, want, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_types_round_where_the_reference_rounds(dtype):
    # Rounding the normalized row to the input dtype before the weight multiply (as
    # transformers does) changes about a quarter of the outputs against rounding once at
    # the end; the kernel may differ from the reference only where its float32 sum of
    # squares rounds differently, by a unit or two in the last place.
    x, weight = _inputs((37, 1000), dtype), _inputs(1000, dtype, seed=1)
    got, want = ops.rms_norm(x, weight, EPS), rms_norm_reference(x, weight, EPS)
    assert (got != want).float().mean() < 0.01
    torch.testing.assert_close(got, want, rtol=2 * torch.finfo(dtype).eps, atol=0.0)


def test_rows_of_a_head_split_view_are_normalized_in_place_of_a_copy():
    qkv = _inputs((5, 3 * 4 * 16), torch.float32)  # [T, (H + 2 H_kv) * D]: q is a slice
    q = qkv[:, : 4 * 16].view(5, 4, 16)  # [T, H, D], rows 16 apart within a token
    assert not q.is_contiguous()
    weight = _inputs(16, torch.float32, seed=1)
    want = rms_norm_reference(q.contiguous(), weight, EPS)
    torch.testing.assert_close(ops.rms_norm(q, weight, EPS), want, rtol=1e-6, atol=1e-6)


def test_strided_rows_of_both_fused_inputs_are_read_where_they_are():
    x, residual = (_inputs((6, 40), torch.bfloat16, seed)[::2, :24] for seed in (0, 2))
    weight = _inputs(24, torch.bfloat16, seed=1)
    normed, new_residual = ops.fused_add_rms_norm(x, residual, weight, EPS)
    assert torch.equal(new_residual, x + residual)
    want = rms_norm_reference(new_residual.float(), weight.float(), EPS)
    _assert_near_reference(normed, want, torch.bfloat16)


UNTAKEN = {
    "float64": (torch.randn(3, 8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)),
    "float32 weight, bf16 x": (torch.randn(3, 8).bfloat16(), torch.randn(8)),
    "strided last dimension": (torch.randn(8, 3).t(), torch.randn(8)),
}


@pytest.mark.parametrize("case", sorted(UNTAKEN))
def test_inputs_the_kernel_does_not_take_get_the_reference_exactly(case):
    x, weight = UNTAKEN[case]
    residual = torch.ones_like(x)
    assert torch.equal(ops.rms_norm(x, weight, EPS), rms_norm_reference(x, weight, EPS))
    got = ops.fused_add_rms_norm(x, residual, weight, EPS)
    want = fused_add_rms_norm_reference(x, residual, weight, EPS)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def test_core_info_names_the_plugin_as_the_cpu_provider_of_both_ops(core_info):
    assert "kernel ops on cpu:" in core_info
    assert "  core::rms_norm: core-cpu-kernels" in core_info
    assert "  core::fused_add_rms_norm: core-cpu-kernels" in core_info
