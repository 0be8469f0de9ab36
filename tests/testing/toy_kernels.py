"""Registration callables for the kernel-op conformance kind (`kernels:toy_kernels:...`).

`register_silu` serves core::silu_and_mul on the CPU with a kernel written apart from
core's reference (float32 sigmoid, one rounding): it conforms. `register_copying_rotary`
serves core::rotary_embedding with a classic bug: it rotates `.contiguous()` copies, which
are the tensors themselves when contiguous but copies of strided views, so a fused QKV's
query and key are never written. `register_nothing` registers no kernel at all.
`register_silu_choices` serves core::silu_and_mul through two kernel-choice candidates,
`exact` and `halved` (which halves its output): the one measured fastest would serve.
`register_silu_invariance` serves it through `exact`, which does not declare
batch-invariant mode, and two that do: `rowwise` (the same elementwise kernel, invariant)
and `batch-dependent`, whose output moves by a last bit per extra row in the batch.
"""

from __future__ import annotations

import torch

from core.kernel_choice import KERNEL_CHOICES, KernelCandidate, OpTiming, Problem
from core.ops import register_impl, rotary_embedding_reference

PROVIDER = "toy-kernels"


def _silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.float().chunk(2, dim=-1)
    return (gate * torch.sigmoid(gate) * up).to(x.dtype)


def _rotary_into_copies(positions, query, key, cos_cache, sin_cache) -> None:
    rotary_embedding_reference(
        positions, query.contiguous(), key.contiguous(), cos_cache, sin_cache
    )


def register_silu() -> None:
    register_impl("silu_and_mul", "cpu", _silu_and_mul, PROVIDER)


def register_copying_rotary() -> None:
    register_impl("rotary_embedding", "cpu", _rotary_into_copies, PROVIDER)


def register_nothing() -> None:
    """A plugin whose registration forgot its kernels."""


class _Exact(KernelCandidate):
    op, name, provider = "silu_and_mul", "exact", PROVIDER

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return _silu_and_mul(x)


class _Halved(_Exact):
    name = "halved"

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return _silu_and_mul(x) / 2


def _silu_by_choice(x: torch.Tensor) -> torch.Tensor:
    problem = Problem("silu_and_mul", str(x.dtype), (x.shape[-1],))
    return KERNEL_CHOICES.kernel(problem, max(x.numel() // x.shape[-1], 1), (x,))(x)


def register_silu_choices() -> None:
    KERNEL_CHOICES.declare_op("silu_and_mul", OpTiming(lambda problem, args, rows: args))
    KERNEL_CHOICES.register(_Exact())
    KERNEL_CHOICES.register(_Halved())
    register_impl("silu_and_mul", "cpu", _silu_by_choice, PROVIDER)


class _Rowwise(_Exact):
    name, batch_invariant = "rowwise", True


class _BatchDependent(_Exact):
    """Declares the mode, yet its output moves by a last bit per extra row of the batch."""

    name, batch_invariant = "batch-dependent", True

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = _silu_and_mul(x)
        return out * (1 + torch.finfo(out.dtype).eps * (x.shape[0] - 1))


def register_silu_invariance() -> None:
    KERNEL_CHOICES.declare_op("silu_and_mul", OpTiming(lambda problem, args, rows: args))
    KERNEL_CHOICES.register(_Exact())
    KERNEL_CHOICES.register(_Rowwise())
    KERNEL_CHOICES.register(_BatchDependent())
    register_impl("silu_and_mul", "cpu", _silu_by_choice, PROVIDER)
