"""Which KV-cache manager serves which spec class, found by walking the spec's MRO.

A subclass that is not registered itself inherits its nearest registered ancestor's
manager, so a new spec only registers what differs. Specs arrive from `core.kv_cache_specs`
entry points (`register(registry)` callables) at startup, and every layer's spec is
checked then: a spec with no registered ancestor is a ValueError at startup, not a
failure mid-serving (and not an assert, which `python -O` would strip).
"""

from __future__ import annotations

from collections.abc import Mapping

from core.kv_cache.spec import KVCacheSpec
from core.plugins.groups import KV_CACHE_SPECS
from core.plugins.registry import PluginRegistry, get_registry


class KVCacheSpecRegistry:
    """spec class -> (manager class, who registered it)."""

    def __init__(self) -> None:
        self._managers: dict[type[KVCacheSpec], tuple[type, str]] = {}

    def register(self, spec_cls: type[KVCacheSpec], manager_cls: type, owner: str = "core"):
        if not (isinstance(spec_cls, type) and issubclass(spec_cls, KVCacheSpec)):
            raise TypeError(f"{spec_cls!r} is not a KVCacheSpec subclass")
        if spec_cls in self._managers:
            _, first = self._managers[spec_cls]
            raise ValueError(f"{spec_cls.__name__} is already registered by {first}")
        self._managers[spec_cls] = (manager_cls, owner)

    def manager_for(self, spec_cls: type[KVCacheSpec]) -> type:
        for ancestor in spec_cls.__mro__:
            if ancestor in self._managers:
                return self._managers[ancestor][0]
        raise ValueError(
            f"no KV-cache manager is registered for {spec_cls.__name__} or any of its "
            f"ancestors; registered: {sorted(c.__name__ for c in self._managers)}"
        )

    def validate(self, specs: Mapping[str, KVCacheSpec]) -> None:
        """Raise ValueError naming every layer whose spec has no manager."""
        missing = {}
        for layer, spec in specs.items():
            try:
                self.manager_for(type(spec))
            except ValueError:
                missing[layer] = type(spec).__name__
        if missing:
            raise ValueError(f"KV-cache specs with no registered manager: {missing}")


class _Registrar:
    """What a plugin's `register` callable receives: registrations carry its name."""

    def __init__(self, registry: KVCacheSpecRegistry, owner: str) -> None:
        self._registry, self._owner = registry, owner

    def register(self, spec_cls: type[KVCacheSpec], manager_cls: type) -> None:
        self._registry.register(spec_cls, manager_cls, owner=self._owner)


def load_spec_registry(registry: PluginRegistry | None = None) -> KVCacheSpecRegistry:
    """A KVCacheSpecRegistry filled by every admitted `core.kv_cache_specs` entry point."""
    registry = registry or get_registry()
    specs = KVCacheSpecRegistry()
    registry.use_each(
        KV_CACHE_SPECS,
        lambda entry, register: register(_Registrar(specs, entry.distribution)),
        "register",
    )
    return specs
