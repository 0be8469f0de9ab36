"""Construction of plugin components from their configuration (`--*-config` JSON kwargs)."""

from __future__ import annotations

import inspect
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
