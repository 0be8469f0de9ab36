"""The KVCacheSpec tree: what one layer stores per block, and so its page size.

Specs are frozen so the scheduler, the KV-cache manager and the worker all see the same
value. Page sizes follow DESIGN.md section 3:

    num_states_per_block = block_size / tokens_per_state
    page_size_bytes      = num_states_per_block * state_content_size_bytes
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from fractions import Fraction

import torch


def _dtype_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


@dataclass(frozen=True, kw_only=True)
class KVCacheSpec(ABC):
    """What one layer keeps in the KV cache for each block of `block_size` tokens."""

    block_size: int
    # How many tokens one stored state covers; a Fraction when a token has several states.
    tokens_per_state: int | Fraction = 1

    @property
    @abstractmethod
    def state_content_size_bytes(self) -> int:
        """Bytes of one stored state."""

    @property
    def num_states_per_block(self) -> int:
        states = Fraction(self.block_size) / Fraction(self.tokens_per_state)
        if states.denominator != 1:
            raise ValueError(
                f"block_size {self.block_size} is not a multiple of tokens_per_state "
                f"{self.tokens_per_state}"
            )
        return int(states)

    @property
    def page_size_bytes(self) -> int:
        return self.num_states_per_block * self.state_content_size_bytes


@dataclass(frozen=True, kw_only=True)
class AttentionSpec(KVCacheSpec):
    """K and V of `num_kv_heads` heads per state; head_size_v defaults to head_size."""

    num_kv_heads: int
    head_size: int
    dtype: torch.dtype
    head_size_v: int | None = None

    @property
    def value_head_size(self) -> int:
        return self.head_size if self.head_size_v is None else self.head_size_v

    @property
    def state_content_size_bytes(self) -> int:
        head_bytes = (self.head_size + self.value_head_size) * _dtype_size(self.dtype)
        return self.num_kv_heads * head_bytes


@dataclass(frozen=True, kw_only=True)
class FullAttentionSpec(AttentionSpec):
    """Attention over the whole context.

    `sliding_window` set here means the layer computes with a window but the cache keeps
    every block (conservative allocation, exact computation) — used when the hybrid
    allocator is off.
    """

    sliding_window: int | None = None


@dataclass(frozen=True, kw_only=True)
class SlidingWindowSpec(AttentionSpec):
    """Attention over the last `sliding_window` tokens; older blocks can be freed."""

    sliding_window: int


@dataclass(frozen=True, kw_only=True)
class MLAAttentionSpec(FullAttentionSpec):
    """Multi-head latent attention: one latent vector per token, no separate V.

    Pages are padded up to a multiple of `alignment` bytes for kernels that need it.
    """

    num_kv_heads: int = 1
    head_size_v: int | None = 0
    alignment: int = 1

    def __post_init__(self) -> None:
        if self.num_kv_heads != 1 or self.head_size_v != 0:
            raise ValueError("MLAAttentionSpec stores one latent: num_kv_heads 1, head_size_v 0")

    @property
    def page_size_bytes(self) -> int:
        dense = super().page_size_bytes
        return math.ceil(dense / self.alignment) * self.alignment


@dataclass(frozen=True, kw_only=True)
class MambaSpec(KVCacheSpec):
    """A recurrent state of fixed size: one state per block whatever its length."""

    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[torch.dtype, ...]

    def __post_init__(self) -> None:
        if len(self.shapes) != len(self.dtypes):
            raise ValueError("MambaSpec needs one dtype per state shape")

    @property
    def num_states_per_block(self) -> int:
        return 1

    @property
    def state_content_size_bytes(self) -> int:
        return sum(
            math.prod(shape) * _dtype_size(dtype)
            for shape, dtype in zip(self.shapes, self.dtypes, strict=True)
        )
