"""Construction of plugin components from their configuration (`--*-config` JSON kwargs)."""

from __future__ import annotations

import inspect
from typing import Any, TypeVar

T = TypeVar("T")


def build_component(cls: type[T], kwargs: dict[str, Any], flag: str) -> T:
    """`cls(**kwargs)`, with a ValueError naming `flag` when the keywords do not fit."""
    try:
        inspect.signature(cls).bind(**kwargs)
    except TypeError as exc:
        name = getattr(cls, "__name__", None) or getattr(cls, "func", cls).__name__
        raise ValueError(f"{flag} does not fit {name}: {exc}") from exc
    return cls(**kwargs)
