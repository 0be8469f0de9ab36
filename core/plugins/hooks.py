"""The pluggy manager that carries the hook implementations of every admitted plugin."""

from __future__ import annotations

import logging
from typing import Any

import pluggy

from core import envs
from core.plugins import hookspecs
from core.plugins.groups import HOOKS
from core.plugins.registry import PluginRegistry, get_registry

logger = logging.getLogger(__name__)

_managers: dict[int, pluggy.PluginManager] = {}


def get_hook_manager(registry: PluginRegistry | None = None) -> pluggy.PluginManager:
    """The hook manager for `registry` (this process's by default), built once."""
    registry = registry or get_registry()
    manager = _managers.get(id(registry))
    if manager is None:
        manager = _build_manager(registry)
        _managers[id(registry)] = manager
    return manager


def _build_manager(registry: PluginRegistry) -> pluggy.PluginManager:
    manager = pluggy.PluginManager("core")
    manager.add_hookspecs(hookspecs)
    for entry in registry.admitted(HOOKS):
        module = registry.load(entry)
        if module is None:
            continue
        try:
            manager.register(module, name=f"{entry.distribution}:{entry.name}")
            # An implementation of an unknown hook is a typo that would fail silently.
            manager.check_pending()
        except Exception as exc:
            manager.unregister(name=f"{entry.distribution}:{entry.name}")
            registry.mark_failed(entry, f"hook registration failed: {exc}")
    if envs.trace_plugins():
        manager.add_hookcall_monitoring(_trace_before, _trace_after)
    return manager


def _trace_before(hook_name: str, hook_impls: list[Any], kwargs: dict[str, Any]) -> None:
    names = [impl.plugin_name for impl in hook_impls]
    logger.info("hook %s called; implementations: %s", hook_name, names or "none")


def _trace_after(outcome: Any, hook_name: str, hook_impls: list[Any], kwargs: dict) -> None:
    answered = [impl.plugin_name for impl in hook_impls]
    result = outcome.get_result() if outcome.exception is None else outcome.exception
    logger.info("hook %s answered by %s: %r", hook_name, answered or "nobody", result)
