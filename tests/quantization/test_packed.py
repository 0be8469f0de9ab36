"""Storing a packed weight on a layer refuses tensors that are not one packed weight."""

from __future__ import annotations

import pytest
import torch

from core.models.layers import ReplicatedLinear
from core.quantization.packed import PackedWeight, store, stored


def _packed(scales_dtype: torch.dtype = torch.float32, groups: int = 2) -> PackedWeight:
    qweight = torch.zeros(4, 32, dtype=torch.uint8)  # 4 rows of 64 four-bit values
    scales = torch.ones(4, groups, dtype=scales_dtype)
    return PackedWeight(qweight, scales, torch.zeros_like(scales), 4)


def test_a_packed_weight_is_stored_and_read_back():
    layer = ReplicatedLinear(64, 4, prefix="mlp.down_proj")
    weight = _packed()
    store(layer, weight)
    assert torch.equal(stored(layer).dequantize(), weight.dequantize())


@pytest.mark.parametrize(
    ("weight", "message"),
    [
        (_packed(torch.float16), "scales and mins must be float32"),
        (_packed(groups=4), "4 groups do not cut 64 inputs into groups of a multiple of 32"),
    ],
)
def test_a_malformed_packed_weight_is_refused_naming_the_layer(weight, message):
    layer = ReplicatedLinear(64, 4, prefix="mlp.down_proj")
    with pytest.raises(ValueError, match=f"^mlp.down_proj: {message}"):
        store(layer, weight)
    assert stored(layer) is None
