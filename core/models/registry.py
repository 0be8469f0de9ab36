"""Finding the model class of a checkpoint's architecture in the `core.models` group.

Core's own models (Llama, Mistral, Qwen2, Qwen3) are entry points of the `core`
distribution, so a plugin adds an architecture exactly the way core does.
"""

from __future__ import annotations

from collections.abc import Sequence

from core.plugins.groups import MODELS
from core.plugins.registry import PluginRegistry, get_registry


def resolve_model_class(
    architectures: Sequence[str], registry: PluginRegistry | None = None
) -> type:
    """The class registered for the first of `architectures` (config.json) that has one.

    Raises ValueError listing the supported architectures when none is registered, with
    the reason of each one whose plugin failed to load.
    """
    registry = registry or get_registry()
    failures: list[str] = []
    for name in architectures:
        entry = registry.get(MODELS, name)
        if entry is None:
            continue
        cls = registry.load(entry)
        if cls is not None:
            return cls
        failures.append(f"{name}: {entry.state.value}: {entry.reason}")
    supported = sorted(e.name for e in registry.admitted(MODELS))
    why = f" ({'; '.join(failures)})" if failures else ""
    raise ValueError(
        f"model architectures {list(architectures)} are not supported{why}; supported: {supported}"
    )
