"""Choosing the tool parser of `--tool-call-parser NAME` (entry-point group `core.tool_parsers`)."""

from __future__ import annotations

from core.plugins.groups import TOOL_PARSERS
from core.plugins.registry import PluginLookupError, PluginRegistry, get_registry
from core.tool_parsers.interface import ToolParser

__all__ = ["tool_parser_class"]


def tool_parser_class(name: str, registry: PluginRegistry | None = None) -> type[ToolParser]:
    """The ToolParser class installed as `name`; ValueError naming --tool-call-parser and
    saying why it cannot be had (not installed: with the names that are)."""
    registry = registry or get_registry()
    try:
        return registry.require(TOOL_PARSERS, name, ToolParser)
    except PluginLookupError as exc:
        raise ValueError(f"--tool-call-parser: {exc}") from exc
