"""Finding the model class of a checkpoint's architecture in the `core.models` group, and
building a model from a checkpoint with it.

Core's own models (Llama, Mistral, Qwen2, Qwen3) are entry points of the `core`
distribution, so a plugin adds an architecture exactly the way core does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

from core.models.arch_config import ArchConfig
from core.plugins.groups import MODELS
from core.plugins.registry import PluginLookupError, PluginRegistry, get_registry

if TYPE_CHECKING:
    from core.model_loader.checkpoint import Checkpoint
    from core.quantization.interface import QuantizationConfig


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


def build_model(
    checkpoint: Checkpoint,
    quant_config: QuantizationConfig | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | None = None,
) -> nn.Module:
    """The model of `checkpoint` in eval mode, its weights loaded: the architecture's
    registered class built with `quant_config` and activation `dtype` (its parameters on
    `device`, else the current default device). With a `quant_config` its methods read the
    tensors as stored; without one every weight is dequantized and cast to `dtype`.
    """
    arch = ArchConfig.from_hf(checkpoint.hf_config)
    model_cls = resolve_model_class(arch.architectures)
    if device is None:
        model = model_cls(arch, quant_config, dtype)
    else:
        with device:
            model = model_cls(arch, quant_config, dtype)
    # Loaded outside the device context: checkpoint readers build their tensors on the CPU.
    model.load_weights(checkpoint.iter_weights(dtype, keep_quantized=quant_config is not None))
    return model.eval()
