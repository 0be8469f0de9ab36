"""Checkpoint: one interface over the weight formats core reads (HF safetensors, GGUF)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


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

    @abstractmethod
    def iter_weights(self, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield `(hf_name, tensor)` for every weight, floating tensors cast to `dtype`.

        Names are the ones a transformers model of `hf_config["architectures"][0]` has in
        its state dict (e.g. "model.layers.0.self_attn.q_proj.weight"), in the layout
        transformers uses. Tensors are read lazily, one at a time; each is a fresh CPU
        tensor the caller may keep or modify. Raises ValueError naming the file when the
        file turns out to be unreadable.
        """
