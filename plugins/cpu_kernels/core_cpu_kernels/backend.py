"""`cpu_paged`: the reference backend with its attention done by C++ kernels.

The kernels read keys and values straight from the paged cache, where the reference
gathers each context into a dense copy for SDPA. Decode rows: one pass over each
sequence's keys. Prefill chunks: a flash-attention kernel that never materializes the
causal mask the reference builds for a chunk on cached context. An FP8 cache
(--kv-cache-dtype fp8_e4m3 / fp8_e5m2) is written as the reference writes it (quantized
with the layer's scales) and read by the kernels byte by byte, each value converted to
float32 as it is read, the scales applied outside their sums (kv_cache_dtype.h). Its MLA
variant (`cpu_paged_mla`) attends decode rows over their cached latents in one pass; like
the reference's, it reads no FP8 cache.
"""

from __future__ import annotations

from typing import Any

import torch

from core import batch_invariant
from core.attention.backends.mla_ref import TorchRefMLABackend, TorchRefMLAImpl
from core.attention.backends.torch_ref import TorchRefBackend, TorchRefImpl
from core.attention.interface import AttentionCapabilities, AttentionImpl, AttentionType
from core.attention.kv_cache_dtype import FP8_KV_CACHE_DTYPES, KVCacheScales
from core.attention.paged_metadata import DecodeBatch, PrefillChunk
from core.kernel_choice import KERNEL_CHOICES
from core_cpu_kernels import (
    _C,  # import after torch: the module links against libtorch
    candidates,
)

# A cache in the model's dtype: read as stored.
_UNSCALED = KVCacheScales()


class CpuPagedImpl(TorchRefImpl):
    """The reference impl with its `forward_decode` and `forward_prefill` hooks done by the
    C++ kernels."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        candidates.register()  # its prefill kernels (re-entrant; the plugin's entry does too)

    def forward_prefill(
        self,
        query: torch.Tensor,  # [q_len, Hq, D]
        key: torch.Tensor,  # [q_len, Hkv, D]
        value: torch.Tensor,  # [q_len, Hkv, D]
        kv_cache: torch.Tensor,  # [num_blocks, 2, block_size, Hkv, D]
        chunk: PrefillChunk,
    ) -> torch.Tensor:  # [q_len, Hq, D]
        """Causal (decoder) chunks through the kernel measured fastest for the layer's
        heads and the chunk's length (candidates.py: the C++ flash kernel or torch's);
        encoder-only (bidirectional) layers stay on the reference.

        Cacheless chunks (a prompt's first) take the kernels as well: the C++ one beat the
        reference's SDPA at every size measured (one layer with SmolLM2's shapes, float32,
        two threads of an AVX2 EPYC: 64 tokens 0.19 vs 0.09 ms, 256 tokens 1.30 vs 0.69
        ms; 64 tokens after 1,024 cached: 2.2 vs 1.2 ms).
        """
        if self.attn_type is not AttentionType.DECODER:
            return super().forward_prefill(query, key, value, kv_cache, chunk)
        if query.stride(-1) != 1:
            query = query.contiguous()
        args = (query, kv_cache, chunk.block_ids, chunk.seq_len, self.scale,
                self.sliding_window or 0, self._read_scales())  # fmt: skip
        fp8 = self.kv_scales is not None
        problem = candidates.prefill_attention_problem(query, kv_cache.shape[3], fp8)
        return KERNEL_CHOICES.kernel(problem, query.shape[0], args)(*args)

    def record_kernel_problems(self, query: torch.Tensor) -> None:
        # Batch-invariant mode attends every row in forward_rows: no prefill kernel runs.
        if self.attn_type is not AttentionType.DECODER or batch_invariant.enabled():
            return
        # No cache exists yet: timing makes its own from the problem (candidates._prompt_of).
        args = (query, None, None, query.shape[0], self.scale, self.sliding_window or 0,
                self._read_scales())  # fmt: skip
        fp8 = self.kv_scales is not None
        problem = candidates.prefill_attention_problem(query, self.num_kv_heads, fp8)
        KERNEL_CHOICES.kernel(problem, 1, args)

    def forward_decode(
        self, query: torch.Tensor, kv_cache: torch.Tensor, decode: DecodeBatch
    ) -> torch.Tensor:  # [B, Hq, D] -> [B, Hq, D]
        return self.forward_rows(query, kv_cache, decode.block_table, decode.seq_lens)

    def forward_rows(
        self,
        query: torch.Tensor,  # [R, Hq, D]
        kv_cache: torch.Tensor,
        block_table: torch.Tensor,  # [R, max_blocks]; rows may share one (stride 0)
        seq_lens: torch.Tensor,  # [R]
    ) -> torch.Tensor:  # [R, Hq, D]
        """The decode kernel: each row alone over its keys in position order, so decode
        rows and, in batch-invariant mode, every prefill row too (TorchRefImpl.forward_rows'
        contract)."""
        query = query.contiguous()
        out = torch.empty_like(query)
        scales = self._read_scales()
        _C.paged_decode_attention(
            out,
            query,
            kv_cache,
            block_table,
            seq_lens,
            self.scale,
            self.sliding_window or 0,
            scales.k_scale,
            scales.v_scale,
        )
        return out

    def _read_scales(self) -> KVCacheScales:
        """What the kernels multiply the cache's K and V by: an FP8 cache's scales, 1.0
        for a cache in the model's dtype."""
        return self.kv_scales or _UNSCALED


class CpuPagedMLAImpl(TorchRefMLAImpl):
    """The reference MLA impl with its `forward_decode` hook done by the C++ kernel: each
    row's latents read once for all heads, under an online softmax (mla_decode.cpp).
    Prefill chunks stay on the reference, which decompresses their context."""

    def forward_decode(
        self,
        query: torch.Tensor,  # [B, H, L]: absorbed into latent space
        kv_cache: torch.Tensor,  # [num_blocks, block_size, L]
        decode: DecodeBatch,
    ) -> torch.Tensor:  # [B, H, R]
        query = query.contiguous()
        out = query.new_empty(*query.shape[:2], self.mla.kv_lora_rank)
        _C.mla_decode_attention(
            out, query, kv_cache, decode.block_table, decode.seq_lens, self.scale
        )
        return out


class CpuPagedMLABackend(TorchRefMLABackend):
    """`cpu_paged`'s backend for multi-head latent attention layers."""

    name = "cpu_paged_mla"

    @staticmethod
    def get_impl_cls() -> type[AttentionImpl]:
        return CpuPagedMLAImpl


class CpuPagedBackend(TorchRefBackend):
    name = "cpu_paged"
    capabilities = AttentionCapabilities(
        dtypes=frozenset({torch.float32, torch.float16, torch.bfloat16}),
        # The kernel is compiled for these head sizes (so its loops fully unroll).
        head_sizes=frozenset({16, 32, 64, 80, 96, 128, 256}),
        # K/V in the model's dtype, or FP8 (--kv-cache-dtype), which the kernels convert
        # as they read it.
        kv_cache_dtypes=frozenset({"auto", *FP8_KV_CACHE_DTYPES}),
        # Neither C++ kernel soft-caps scores (the reference's capability is not inherited).
        logits_soft_cap=False,
        # forward_rows: the decode kernel, which attends each row alone.
        batch_invariant=True,
    )
    mla_backend = CpuPagedMLABackend  # multi-head latent attention layers

    @staticmethod
    def get_impl_cls() -> type[AttentionImpl]:
        return CpuPagedImpl
