"""Finding the model class of a checkpoint's architecture in the `core.models` group.

Core's own models (Llama, Mistral, Qwen2, Qwen3) are entry points of the `core`
distribution, so a plugin adds an architecture exactly the way core does.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from core.plugins.groups import MODELS
from core.plugins.registry import PluginLookupError, PluginRegistry, get_registry


def resolve_model_class(
    architectures: Sequence[str], registry: PluginRegistry | None = None
) -> type[nn.Module]:
    """The class registered for the first of `architectures` (config.json) that has one.

    Raises ValueError when none has one, listing the installed architectures with the
    reason of each one that cannot be loaded (the requested ones included).
    """
    registry = registry or get_registry()
    for name in architectures:
        try:
            return registry.require(MODELS, name, nn.Module)
        except PluginLookupError:
            continue  # the next architecture may be supported; the error lists them all
    installed = registry.describe_installed(MODELS)
    raise ValueError(
        f"model architectures {list(architectures)} are not supported; installed: {installed}"
    )
