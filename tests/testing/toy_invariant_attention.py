"""Attention backends for the kit's invariance check, built on the reference (which, in
batch-invariant mode, attends every row alone through `TorchRefImpl.forward_rows`).

`StepSizedBackend` then moves every output by a last bit per extra token in the step, as a
kernel that picks its blocking from the step's size would: the kit must catch it.
`UndeclaredBackend` is the reference without the declaration: the kit skips it.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from core.attention.backends.torch_ref import TorchRefBackend, TorchRefImpl
from core.attention.interface import AttentionImpl


class StepSizedImpl(TorchRefImpl):
    def forward(self, query, key, value, kv_cache, attn_metadata) -> torch.Tensor:
        output = super().forward(query, key, value, kv_cache, attn_metadata)
        num_tokens = len(attn_metadata.slot_mapping)
        return output * (1 + torch.finfo(output.dtype).eps * (num_tokens - 1))


class StepSizedBackend(TorchRefBackend):
    name = "step_sized"
    mla_backend = None

    @staticmethod
    def get_impl_cls() -> type[AttentionImpl]:
        return StepSizedImpl


class UndeclaredBackend(TorchRefBackend):
    name = "undeclared"
    mla_backend = None
    capabilities = replace(TorchRefBackend.capabilities, batch_invariant=False)
