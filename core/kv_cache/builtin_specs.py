"""Core's own `core.kv_cache_specs` entry point: the built-in spec -> manager pairs.

Registered through the same entry-point group as plugins (DESIGN.md section 3), so
core's managers and a plugin's are found the same way. Subclasses inherit through the
registry's MRO walk: MLAAttentionSpec, and a FullAttentionSpec with a sliding window
(computed with a window, cached in full), get the full-attention manager.
"""

from __future__ import annotations

from typing import Protocol

from core.kv_cache.single_type_manager import FullAttentionManager, SlidingWindowManager
from core.kv_cache.spec import FullAttentionSpec, KVCacheSpec, SlidingWindowSpec

__all__ = ["register"]


class _Registrar(Protocol):
    def register(self, spec_cls: type[KVCacheSpec], manager_cls: type) -> None: ...


def register(registry: _Registrar) -> None:
    registry.register(FullAttentionSpec, FullAttentionManager)
    registry.register(SlidingWindowSpec, SlidingWindowManager)
