"""The pluggy manager that carries the hook implementations of every admitted plugin."""

from __future__ import annotations

import logging
import weakref
from typing import Any

import pluggy

from core import envs
from core.plugins import hookspecs
from core.plugins.groups import HOOKS
from core.plugins.registry import PluginEntry, PluginRegistry, get_registry

logger = logging.getLogger(__name__)

# Keyed by the registry object, not id(): a registry that is gone may free its id for a
# new one, which must not inherit the old manager.
_managers: weakref.WeakKeyDictionary[PluginRegistry, pluggy.PluginManager] = (
    weakref.WeakKeyDictionary()
)


def get_hook_manager(registry: PluginRegistry | None = None) -> pluggy.PluginManager:
    """The hook manager for `registry` (this process's by default), built once."""
    registry = registry or get_registry()
    manager = _managers.get(registry)
    if manager is None:
        manager = _build_manager(registry)
        _managers[registry] = manager
    return manager


def _build_manager(registry: PluginRegistry) -> pluggy.PluginManager:
    manager = pluggy.PluginManager("core")
    manager.add_hookspecs(hookspecs)

    def register(entry: PluginEntry, module: Any) -> None:
        name = f"{entry.distribution}:{entry.name}"
        manager.register(module, name=name)
        try:
            # An implementation of an unknown hook is a typo that would fail silently.
            manager.check_pending()
        except Exception:
            manager.unregister(name=name)
            raise

    registry.use_each(HOOKS, register, "hook registration")
    if envs.trace_plugins():
        manager.add_hookcall_monitoring(_trace_before, _trace_after)
    return manager


def call_each(manager: pluggy.PluginManager, name: str, **kwargs: Any) -> None:
    """Call every implementation of the hook `name` on its own, in pluggy's order.

    For hooks whose results nobody collects (commands, lifecycle notices): one
    implementation that raises is logged with its plugin's name and the others still run,
    so a broken plugin never stops core.
    """
    impls = list(reversed(getattr(manager.hook, name).get_hookimpls()))
    trace = envs.trace_plugins()
    if trace:
        _trace_before(name, impls, kwargs)
    for impl in impls:
        try:
            result = impl.function(**{arg: kwargs[arg] for arg in impl.argnames})
        except Exception:
            logger.exception("hook %s of plugin %s failed", name, impl.plugin_name)
            continue
        if trace:
            logger.info("hook %s answered by %s: %r", name, [impl.plugin_name], result)


def _trace_before(hook_name: str, hook_impls: list[Any], kwargs: dict[str, Any]) -> None:
    names = [impl.plugin_name for impl in hook_impls]
    logger.info("hook %s called; implementations: %s", hook_name, names or "none")


def _trace_after(outcome: Any, hook_name: str, hook_impls: list[Any], kwargs: dict) -> None:
    answered = [impl.plugin_name for impl in hook_impls]
    result = outcome.get_result() if outcome.exception is None else outcome.exception
    logger.info("hook %s answered by %s: %r", hook_name, answered or "nobody", result)
