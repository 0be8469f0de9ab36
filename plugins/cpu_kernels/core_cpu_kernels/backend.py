"""`cpu_paged`: the reference backend with decode attention done by a C++ kernel.

Decode rows dominate serving steps; the kernel reads each sequence's keys and values once,
straight from the paged cache, instead of gathering them into a dense copy for SDPA.
Prefill chunks are GEMM-shaped work that SDPA already does well, so they stay on the
reference path.
"""

from __future__ import annotations

import torch

from core.attention.backends.torch_ref import TorchRefBackend, TorchRefImpl
from core.attention.interface import AttentionCapabilities, AttentionImpl
from core.attention.paged_metadata import DecodeBatch
from core_cpu_kernels import _C  # import after torch: the module links against libtorch


class CpuPagedImpl(TorchRefImpl):
    """The reference impl with its `forward_decode` hook done by the C++ kernel."""

    def forward_decode(
        self, query: torch.Tensor, kv_cache: torch.Tensor, decode: DecodeBatch
    ) -> torch.Tensor:  # [B, Hq, D] -> [B, Hq, D]
        query = query.contiguous()
        out = torch.empty_like(query)
        _C.paged_decode_attention(
            out,
            query,
            kv_cache,
            decode.block_table,
            decode.seq_lens,
            self.scale,
            self.sliding_window or 0,
        )
        return out


class CpuPagedBackend(TorchRefBackend):
    name = "cpu_paged"
    capabilities = AttentionCapabilities(
        dtypes=frozenset({torch.float32, torch.float16, torch.bfloat16}),
        # The kernel is compiled for these head sizes (so its loops fully unroll).
        head_sizes=frozenset({16, 32, 64, 80, 96, 128, 256}),
    )

    @staticmethod
    def get_impl_cls() -> type[AttentionImpl]:
        return CpuPagedImpl
