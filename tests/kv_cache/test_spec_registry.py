"""Spec -> manager lookup by MRO, and startup validation with ValueError."""

from __future__ import annotations

import importlib.metadata as metadata
from dataclasses import dataclass

import pytest
import torch
from plugin_sources import API

from core.kv_cache.registry import KVCacheSpecRegistry, load_spec_registry
from core.kv_cache.spec import (
    AttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from core.plugins import PluginRegistry
from core.plugins.groups import ALL_GROUPS, KV_CACHE_SPECS


class FullManager:
    pass


class SlidingManager:
    pass


@dataclass(frozen=True, kw_only=True)
class CustomFullSpec(FullAttentionSpec):
    """An unregistered subclass: inherits its ancestor's manager."""


@dataclass(frozen=True, kw_only=True)
class OrphanSpec(KVCacheSpec):
    @property
    def state_content_size_bytes(self) -> int:
        return 1


def full(block_size: int = 4) -> FullAttentionSpec:
    return FullAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=2, dtype=torch.float32
    )


@pytest.fixture
def registry() -> KVCacheSpecRegistry:
    specs = KVCacheSpecRegistry()
    specs.register(FullAttentionSpec, FullManager)
    specs.register(SlidingWindowSpec, SlidingManager)
    return specs


def test_exact_class_resolves_to_its_manager(registry):
    assert registry.manager_for(FullAttentionSpec) is FullManager
    assert registry.manager_for(SlidingWindowSpec) is SlidingManager


def test_unregistered_subclass_resolves_to_registered_ancestor(registry):
    assert registry.manager_for(CustomFullSpec) is FullManager


def test_spec_without_registered_ancestor_is_a_value_error(registry):
    with pytest.raises(ValueError, match="OrphanSpec"):
        registry.manager_for(OrphanSpec)
    with pytest.raises(ValueError, match="MambaSpec"):
        registry.manager_for(MambaSpec)
    # AttentionSpec is an ancestor of registered classes, not a descendant of one.
    with pytest.raises(ValueError, match="AttentionSpec"):
        registry.manager_for(AttentionSpec)


def test_startup_validation_names_every_unserved_layer(registry):
    mamba = MambaSpec(block_size=4, shapes=((2,),), dtypes=(torch.float32,))
    specs = {
        "layers.0.attn": full(),
        "layers.1.custom": CustomFullSpec(
            block_size=4, num_kv_heads=1, head_size=2, dtype=torch.float32
        ),
        "layers.2.mamba": mamba,
    }
    with pytest.raises(ValueError, match="layers.2.mamba") as error:
        registry.validate(specs)
    assert "layers.0.attn" not in str(error.value)
    registry.validate({k: v for k, v in specs.items() if k != "layers.2.mamba"})


def test_duplicate_registration_names_the_first_owner(registry):
    with pytest.raises(ValueError, match="already registered by core"):
        registry.register(FullAttentionSpec, SlidingManager, owner="acme")


def test_plugins_register_specs_through_the_entry_point_group(site):
    site.add("mamba-specs", {KV_CACHE_SPECS: {"mamba": "mamba_specs:register"}}, {
        "mamba_specs/__init__.py": API + """
from core.kv_cache.spec import MambaSpec

class MambaManager:
    pass

def register(registry):
    registry.register(MambaSpec, MambaManager)
"""})  # fmt: skip
    points = [ep for group in ALL_GROUPS for ep in metadata.entry_points(group=group)]
    specs = load_spec_registry(PluginRegistry(points, None))
    assert specs.manager_for(MambaSpec).__name__ == "MambaManager"
    with pytest.raises(ValueError, match="already registered by mamba-specs"):
        specs.register(MambaSpec, FullManager)
