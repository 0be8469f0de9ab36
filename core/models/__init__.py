"""Models: the architecture registry, ArchConfig, and the Llama-family decoders.

The model classes themselves are imported lazily, through `resolve_model_class`.
"""

from collections.abc import Iterator

from torch import nn

from core.attention.layer import Attention
from core.models.arch_config import ArchConfig
from core.models.registry import build_model, resolve_model_class

__all__ = ["ArchConfig", "build_model", "iter_attention_layers", "resolve_model_class"]


def iter_attention_layers(model: nn.Module) -> Iterator[Attention]:
    """Every Attention layer of `model`, in module order (the worker binds backend and KV
    cache to each, keyed by its `layer_name`)."""
    for module in model.modules():
        if isinstance(module, Attention):
            yield module
