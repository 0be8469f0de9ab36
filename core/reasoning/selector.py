"""Choosing the reasoning parser of `--reasoning-parser NAME` (entry-point group
`core.reasoning_parsers`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from core.plugins.groups import REASONING_PARSERS
from core.plugins.registry import PluginLookupError, PluginRegistry, get_registry
from core.reasoning.interface import ReasoningParser

if TYPE_CHECKING:
    from core.tokenizer import Tokenizer

__all__ = ["build_reasoning_parser", "reasoning_parser_class"]


def reasoning_parser_class(
    name: str, registry: PluginRegistry | None = None
) -> type[ReasoningParser]:
    """The ReasoningParser class installed as `name`; ValueError naming --reasoning-parser
    and saying why it cannot be had (not installed: with the names that are)."""
    registry = registry or get_registry()
    try:
        return registry.require(REASONING_PARSERS, name, ReasoningParser)
    except PluginLookupError as exc:
        raise ValueError(f"--reasoning-parser: {exc}") from exc


def build_reasoning_parser(name: str, tokenizer: Tokenizer) -> ReasoningParser:
    """The parser `name` over `tokenizer`; ValueError naming --reasoning-parser when it is
    not installed or the tokenizer lacks its markers."""
    cls = reasoning_parser_class(name)
    try:
        return cls(tokenizer)
    except ValueError as exc:
        raise ValueError(f"--reasoning-parser {name}: {exc}") from exc
