"""core::int8_linear: per-token int8 activations times int8 weights, integer sums exact, and
the CPU kernels it chooses among by timing all equal its reference."""

from __future__ import annotations

import pytest
import torch

from core.envs import KERNEL_CHOICE_ENV
from core.kernel_choice import KERNEL_CHOICES
from core.ops import int8_linear, int8_linear_reference
from core.ops.int8_linear import INT8_LINEAR
from core.quantization import int8_linear_cpu


def expected(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """The op as its docstring defines it, computed here: each row of x to int8 by its own
    largest |x|, int64 sums, both scales, one rounding to x's dtype."""
    x32 = x.float()
    amax = x32.abs().amax(dim=1, keepdim=True)
    factor = 127 / torch.where(amax > 0, amax, torch.ones_like(amax))
    xq = torch.round(x32 * factor).clamp(-127, 127).long()
    sums = xq @ weight.long().T  # [T, N], exact
    return (sums.double() * (amax / 127).double() * weight_scale.double()).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_sums_exactly_and_rounds_once(dtype):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4, 300, generator=generator).to(dtype)
    x[2] = 0  # a row of zeros quantizes to zeros
    weight = torch.randint(-128, 128, (270, 300), generator=generator).to(torch.int8)
    scale = torch.rand(270, generator=generator) * 1e-3
    got = int8_linear_reference(x, weight, scale)
    assert got.dtype == dtype
    assert torch.equal(got, expected(x, weight, scale))
    assert torch.equal(got[2], torch.zeros(270, dtype=dtype))


@pytest.fixture
def cpu_kernels():
    """Core's CPU kernels registered, no choice made before or kept after."""
    int8_linear_cpu.register()
    KERNEL_CHOICES.chosen.clear()
    yield
    KERNEL_CHOICES.chosen.clear()


@pytest.mark.usefixtures("cpu_kernels")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_every_cpu_kernel_matches_the_reference(monkeypatch, dtype):
    tolerance = INT8_LINEAR.conformance.tolerances[dtype]
    for candidate in KERNEL_CHOICES.candidates[int8_linear_cpu.OP]:
        if not candidate.available():
            continue
        monkeypatch.setenv(KERNEL_CHOICE_ENV, f"{int8_linear_cpu.OP}={candidate.name}")
        KERNEL_CHOICES.chosen.clear()
        for sample in INT8_LINEAR.conformance.samples(dtype, torch.device("cpu")):
            torch.testing.assert_close(
                int8_linear(*sample.args),
                int8_linear_reference(*sample.args),
                rtol=tolerance.rtol,
                atol=tolerance.atol,
                msg=lambda m, c=candidate, s=sample: f"{c.name}, {s.name}: {m}",
            )
