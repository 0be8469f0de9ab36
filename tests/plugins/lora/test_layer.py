"""LoRALinearMethod on the CPU path: a slot's values never reach rows of another slot."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("core_lora", reason="core-lora is not installed (optional plugin)")

from core_lora.adapter import LoRAWeights  # noqa: E402
from core_lora.layer import LoRALinearMethod  # noqa: E402
from core_lora.mapping import SlotMapping  # noqa: E402

from core.forward_context import ForwardContext, set_forward_context  # noqa: E402
from core.lora.interface import NO_SLOT  # noqa: E402
from core.models.layers.linear import ReplicatedLinear  # noqa: E402

IN, OUT, RANK = 16, 8, 2


def _adapter(seed: int, scale: float = 1.0) -> dict[int, LoRAWeights]:
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(RANK, IN, generator=gen) * scale
    return {0: LoRAWeights(a, torch.randn(OUT, RANK, generator=gen))}


def _forward(layer: ReplicatedLinear, x: torch.Tensor, slots: list[int]) -> torch.Tensor:
    mapping = SlotMapping(torch.tensor(slots))
    with set_forward_context(ForwardContext({}, x.shape[0], lora_mapping=mapping)):
        return layer(x)


@pytest.mark.parametrize("bad", [math.inf, math.nan, torch.finfo(torch.float32).max])
def test_a_slot_whose_shrink_overflows_leaves_other_rows_exact(bad: float) -> None:
    """Slot 1's A makes x @ A inf or NaN (weights that passed no check, or finite ones
    whose product overflows): the base row and slot 0's row are what they are without
    slot 1 (up to the summation order of the wider matmul)."""
    torch.manual_seed(0)
    layer = ReplicatedLinear(IN, OUT)
    for param in layer.parameters():
        param.data.normal_()  # created uninitialized
    layer.wrap_linear_method(lambda base: LoRALinearMethod(base, num_slots=2, max_rank=RANK))
    layer.linear_method.set_slot(layer, 0, _adapter(1))
    x = torch.randn(3, IN)
    clean = _forward(layer, x, [NO_SLOT, 0, 0])

    poisoned = _adapter(2)
    poisoned[0].a.fill_(bad)
    layer.linear_method.set_slot(layer, 1, poisoned)
    mixed = _forward(layer, x, [NO_SLOT, 0, 1])

    torch.testing.assert_close(mixed[:2], clean[:2])
    assert not torch.isfinite(mixed[2]).all()
