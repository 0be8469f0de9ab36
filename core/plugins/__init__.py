"""The plugin framework: entry-point discovery, lazy loading, allowlist, versions, hooks.

See DESIGN.md section 3. Groups are in `core.plugins.groups`, hook specifications in
`core.plugins.hookspecs`.
"""

from core.plugins.components import build_component
from core.plugins.hookspecs import hookimpl
from core.plugins.registry import (
    PLUGIN_API_VERSION,
    EntryState,
    PluginEntry,
    PluginLookupError,
    PluginRegistry,
    get_registry,
)

__all__ = [
    "PLUGIN_API_VERSION",
    "EntryState",
    "PluginEntry",
    "PluginLookupError",
    "PluginRegistry",
    "build_component",
    "get_registry",
    "hookimpl",
]
