"""`flash`: paged attention in Triton kernels, reading K/V straight from the cache pages.

One launch attends every new token of a step (prefill chunks, chunks on cached context,
decodes) through the block table; a decode-only step with a long context instead splits
each request's keys over several programs and merges them (flash-decoding), so a small
batch still fills the device. The KV layout is the reference's, so the cache written
here reads back the same through any other backend of that layout.

This module imports neither triton nor the kernels: the selector loads the class on any
machine and asks `supports_combination`, which says why it cannot serve (no triton, no
GPU); the kernels are imported at the first forward.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import torch

from core.attention.backends.torch_ref import TorchRefBackend
from core.attention.interface import (
    AttentionBackend,
    AttentionCapabilities,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionRequirements,
    AttentionType,
    GraphSupport,
)
from core_attn_flash.metadata import FlashAttentionMetadata, FlashAttentionMetadataBuilder

__all__ = ["DEFAULT_SPLIT_KV_MIN_SEQ_LEN", "FlashAttentionBackend", "FlashAttentionImpl"]

KERNELS_MODULE = "core_attn_flash.kernels"
# Below this context a decode step's one program per (request, KV head) walks the keys
# quickly enough; past it splitting the walk pays for the extra merge kernel.
DEFAULT_SPLIT_KV_MIN_SEQ_LEN = 1024


class FlashAttentionImpl(AttentionImpl):
    """Writes the step's K/V into the cache, then runs the unified or split-KV kernel.

    `split_kv_min_seq_len` (--attention-backend-config) is the max_seq_len from which a
    decode-only step takes the split-KV path.
    """

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        sliding_window: int | None = None,
        attn_type: AttentionType = AttentionType.DECODER,
        split_kv_min_seq_len: int = DEFAULT_SPLIT_KV_MIN_SEQ_LEN,
    ) -> None:
        super().__init__(num_heads, head_size, scale, num_kv_heads, sliding_window, attn_type)
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads")
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"sliding_window must be at least 1, got {sliding_window}")
        if split_kv_min_seq_len < 1:
            raise ValueError(f"split_kv_min_seq_len must be at least 1, got {split_kv_min_seq_len}")
        self.split_kv_min_seq_len = split_kv_min_seq_len

    def forward(
        self,
        query: torch.Tensor,  # [T, Hq, D]
        key: torch.Tensor,  # [T, Hkv, D]
        value: torch.Tensor,  # [T, Hkv, D]
        kv_cache: torch.Tensor,  # [num_blocks, 2, block_size, Hkv, D]
        attn_metadata: FlashAttentionMetadata,
    ) -> torch.Tensor:  # [T, Hq, D]; rows of no request are zero
        kernels = _kernels()
        batch = attn_metadata
        kernels.reshape_and_cache(key, value, kv_cache, batch.slot_mapping, batch.num_actual_tokens)
        output = torch.zeros_like(query)
        if batch.num_reqs == 0:
            return output
        if self.uses_split_kv(batch):
            partials = batch.split_kv.partials(
                batch.num_reqs, *kernels.partials_shape(self.num_heads, self.head_size)
            )
            kernels.split_kv_decode(
                output, query, kv_cache, batch, self.scale, self.sliding_window, partials
            )
        else:
            kernels.unified_attention(
                output, query, kv_cache, batch, self.scale, self.sliding_window
            )
        return output

    def uses_split_kv(self, batch: FlashAttentionMetadata) -> bool:
        """A decode-only step (every request at most one new token) with a long context."""
        return batch.max_query_len <= 1 and batch.max_seq_len >= self.split_kv_min_seq_len


class FlashAttentionBackend(AttentionBackend):
    name = "flash"
    capabilities = AttentionCapabilities(
        dtypes=frozenset({torch.float32, torch.float16, torch.bfloat16}),
        # Any head size works (tiles pad it to a power of two); these are the tested ones.
        head_sizes=frozenset({16, 32, 64, 80, 96, 128, 256}),
        block_sizes=frozenset({16, 32, 64}),
        kv_cache_dtypes=frozenset({"auto"}),
        logits_soft_cap=False,  # the kernels do not soft-cap scores (Gemma 2 runs elsewhere)
    )
    # Launches depend only on the batch's host integers (see the kernels module), and the
    # metadata lives in persistent buffers: any padded batch can be captured whole.
    graph_support = GraphSupport.ALWAYS

    @classmethod
    def supports_combination(cls, req: AttentionRequirements) -> str | None:
        reason = cls.capabilities.check(req)
        if reason is not None:
            return reason
        try:
            import triton  # noqa: F401
        except ImportError as exc:
            return f"triton is not importable ({exc}); it comes with torch's CUDA/ROCm wheels"
        if os.environ.get("TRITON_INTERPRET") == "1":
            return None
        if not torch.cuda.is_available():
            return "no CUDA or ROCm GPU is available (and TRITON_INTERPRET is not 1)"
        return None

    @staticmethod
    def get_impl_cls() -> type[AttentionImpl]:
        return FlashAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[AttentionMetadataBuilder]:
        return FlashAttentionMetadataBuilder

    @staticmethod
    def get_kv_cache_shape(
        num_blocks: int, block_size: int, num_kv_heads: int, head_size: int
    ) -> tuple[int, ...]:
        """The reference's layout: [num_blocks, 2, block_size, num_kv_heads, head_size]."""
        return TorchRefBackend.get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size)


def _kernels() -> ModuleType:
    """The kernels module, imported at first use (through sys.modules, where a test may
    have put a copy whose kernels run in Triton's interpreter)."""
    return importlib.import_module(KERNELS_MODULE)
