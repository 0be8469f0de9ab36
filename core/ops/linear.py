"""The dense linear kernel op: y = x W^T + b, the matmul of every unquantized layer.

The reference is torch's: `F.linear`, except for a single 16-bit row on the CPU, which
goes through `torch.mv` / `torch.addmv` (the same product; torch's 16-bit matmul of one row
takes a slow path, its matrix-vector product is 1.5-4x faster on SmolLM2's shapes with 2 threads).
A device kernel must equal it to its dtype's precision: float32 products summed in
float32 (in any order), 16-bit results rounded once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from core import batch_invariant
from core.ops.registry import CORE_OPS
from core.ops.samples import Conformance, OpSample, Tolerance, randn

_MV_DTYPES = (torch.bfloat16, torch.float16)


def linear_reference(
    x: torch.Tensor,  # [..., K]
    weight: torch.Tensor,  # [N, K]
    bias: torch.Tensor | None = None,  # [N]
) -> torch.Tensor:  # [..., N]
    """x @ weight.T + bias (row by row in batch-invariant mode)."""
    if batch_invariant.enabled():
        return batch_invariant.rowwise(_linear, (x,), weight, bias)
    return _linear(x, weight, bias)


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    # The row count last: a compiled float32 forward then has no size-1 branch to trace.
    if x.dtype in _MV_DTYPES and x.device.type == "cpu" and x.dim() == 2 and x.shape[0] == 1:
        if bias is None:
            return torch.mv(weight, x[0])[None]
        return torch.addmv(bias, weight, x[0])[None]  # rounded once, as F.linear
    return F.linear(x, weight, bias)


def _linear_fake(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _linear_samples(dtype: torch.dtype, device: torch.device) -> list[OpSample]:
    def sample(name: str, x: torch.Tensor, n: int, bias: bool) -> OpSample:
        k = x.shape[-1]
        weight = randn((n, k), dtype, device, seed=1, scale=0.5)
        return OpSample(name, (x, weight, randn((n,), dtype, device, seed=2) if bias else None))

    def rows(t: int, k: int) -> torch.Tensor:
        return randn((t, k), dtype, device, seed=0)

    strided = randn((40, 3), dtype, device, seed=0).t()  # [3, 40], rows 1 apart
    return [
        sample("one row (decode)", rows(1, 64), 96, False),
        sample("odd sizes past the vector and row blocks, with bias", rows(5, 13), 7, True),
        sample("an input smaller than one vector", rows(3, 1), 5, False),
        sample("strided rows", strided, 9, True),
        sample("3-D activations", randn((2, 3, 24), dtype, device, seed=0), 10, False),
        sample("many rows (a prefill chunk)", rows(33, 64), 48, True),
    ]


# A kernel sums in another order: float32 error up to a few units of float32 precision of
# |x| @ |W|^T (at most ~30 on the samples), hence the absolute term; a half-type result is
# rounded once, from a float32 sum that may differ from the reference's in its last bits.
_SUM_ORDER_ATOL = 1e-4
TOLERANCES = {
    torch.float32: Tolerance(rtol=1e-5, atol=_SUM_ORDER_ATOL),
    torch.bfloat16: Tolerance(rtol=2 * torch.finfo(torch.bfloat16).eps, atol=_SUM_ORDER_ATOL),
    torch.float16: Tolerance(rtol=2 * torch.finfo(torch.float16).eps, atol=_SUM_ORDER_ATOL),
}

LINEAR = CORE_OPS.declare(
    "linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor",
    linear_reference,
    _linear_fake,
    Conformance(_linear_samples, TOLERANCES),
)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`core::linear` through the kernel serving x's device type (see LINEAR)."""
    return LINEAR(x, weight, bias)
