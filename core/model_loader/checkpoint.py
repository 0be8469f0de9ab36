"""Checkpoint: one interface over the weight formats core reads (HF safetensors, GGUF)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from core.quantization.selector import StoredQuantization


@dataclass(frozen=True)
class Checkpoint(ABC):
    """A model on disk: where it is, its architecture config and its weights.

    Whatever the file format, `hf_config` is a transformers-style config.json dict
    (`architectures`, `hidden_size`, `num_key_value_heads`, `rope_theta`, `rope_scaling`,
    `torch_dtype`, ...) and `iter_weights` yields Hugging Face parameter names, so the
    model code never learns which format it was loaded from.

    Attributes:
        path: the Hugging Face model directory, or the .gguf file.
        hf_config: the architecture config, transformers config.json vocabulary.
        served_name: the default model id the server reports for this checkpoint.
    """

    path: Path
    hf_config: dict[str, Any]
    served_name: str

    @property
    def stored_quantization(self) -> StoredQuantization:
        """The quantization method the weights are stored in: config.json's
        `quantization_config.quant_method`, if any."""
        settings = self.hf_config.get("quantization_config") or {}
        return StoredQuantization(method=settings.get("quant_method"))

    @abstractmethod
    def iter_weights(
        self, dtype: torch.dtype, keep_quantized: bool = False
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield `(hf_name, tensor)` for every weight, floating tensors cast to `dtype`.

        With `keep_quantized` (a quantization method will read the tensors), nothing is
        cast or dequantized: tensors come as stored, and each parameter's weight loader
        converts what it receives. A format with a block-quantized encoding of its own
        says how it yields it (GGUF: `GGUFCheckpoint.iter_weights`).

        Names are the ones a transformers model of `hf_config["architectures"][0]` has in
        its state dict (e.g. "model.layers.0.self_attn.q_proj.weight"), in the layout
        transformers uses. Tensors are read lazily, one at a time; each is a fresh CPU
        tensor the caller may keep or modify. Raises ValueError naming the file when the
        file turns out to be unreadable.
        """
