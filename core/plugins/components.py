"""Construction of plugin components from their configuration (`--*-config` JSON kwargs)."""

from __future__ import annotations

import inspect
import json
from typing import Any, TypeVar

T = TypeVar("T")


def build_component(cls: type[T], kwargs: dict[str, Any], flag: str) -> T:
    """`cls(**kwargs)`, with a ValueError naming `flag` when the keywords do not fit."""
    name = getattr(cls, "__name__", None) or getattr(cls, "func", cls).__name__
    try:
        inspect.signature(cls).bind(**kwargs)
        # A class without its own __init__ shows a permissive inherited signature (e.g.
        # nn.Module's *args, **kwargs) that only the call itself refuses.
        return cls(**kwargs)
    except TypeError as exc:
        raise ValueError(f"{flag} does not fit {name}: {exc}") from exc


def parse_json_object(flag: str, value: str | dict) -> dict:
    """The JSON object a `--*-config` flag carries (a dict passes through); ValueError
    naming `flag` when the text is not JSON or not an object."""
    if isinstance(value, dict):
        return value
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{flag} must be a JSON object: {exc}") from exc
    if not isinstance(parsed, dict):
        raise ValueError(f"{flag} must be a JSON object, got {type(parsed).__name__}")
    return parsed
