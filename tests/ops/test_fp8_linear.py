"""core::fp8_linear's layout, its quantizer and its tiled reference."""

from __future__ import annotations

import pytest
import torch

from core.ops.fp8_linear import (
    FP8_DTYPE,
    FP8_LINEAR,
    TILE_ROWS,
    dequantize,
    fp8_linear,
    quantize,
)


def test_each_weight_is_its_value_times_its_rows_block_scale():
    weight = torch.tensor([[1.0, -2.0, 0.5], [3.0, 0.25, -1.0]]).to(FP8_DTYPE)
    scales = torch.tensor([[2.0, 10.0], [0.5, 4.0]])  # blocks of 2 inputs: the last cut short
    want = torch.tensor([[2.0, -4.0, 5.0], [1.5, 0.125, -4.0]])
    assert torch.equal(dequantize(weight, scales, block_k=2), want)


def test_quantize_maps_each_blocks_largest_weight_onto_448():
    w = torch.tensor([[1.0, -8.0, 0.0], [2.0, 4.0, 0.0], [0.0, 0.0, 0.0]])
    values, scales = quantize(w, block_n=2, block_k=2)
    assert torch.equal(scales, torch.tensor([[8.0 / 448, 0.0], [0.0, 0.0]]))
    assert values[0, 1].float() == -448 and values[1, 1].float() == 224
    assert torch.equal(values.float()[:, 2], torch.zeros(3))  # a zero block stays zeros


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_reference_multiplies_tile_by_tile_as_one_float32_product(dtype):
    torch.manual_seed(0)
    n, k = TILE_ROWS + 37, 80  # a second, partial tile
    weight, block_scales = quantize(torch.randn(n, k), block_n=16, block_k=32)
    scales = block_scales.repeat_interleave(16, dim=0)[:n]
    x = torch.randn(3, k).to(dtype)
    got = fp8_linear(x, weight, scales, 32)
    assert got.dtype == dtype
    want = (x.float() @ dequantize(weight, scales, 32).T).to(dtype)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)


def test_the_conformance_samples_run_on_the_reference():
    for dtype in FP8_LINEAR.conformance.tolerances:
        for sample in FP8_LINEAR.conformance.samples(dtype, torch.device("cpu")):
            x, weight = sample.args[:2]
            assert FP8_LINEAR.reference(*sample.args).shape == (x.shape[0], weight.shape[0])
