"""SupportsMultiModal: what a model class that takes images provides besides the decoder
interface (see LlamaForCausalLM's docstring).

The frontend builds the model's processor once (`multimodal_processor`); the worker runs
`embed_multimodal` for the items a step schedules, caches the outputs by item identifier,
and runs every step's forward on `inputs_embeds`: `embed_input_ids` of the step's tokens
with the rows at placeholder positions replaced by the items' embeddings.

M-RoPE models (Qwen2-VL) rotate by three position streams (time, height, width): they
set `uses_mrope` and give each prompt's positions (`mrope_positions`); the runner then
passes `positions` as [3, T] to `forward` (attention and the KV cache keep the 1-D
positions). Generated tokens continue from the prompt's last position: token p >= P
(the prompt's length) is at p + delta in all three streams.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch

from core.multimodal.inputs import MultiModalFeature
from core.multimodal.processing import MultiModalProcessor

__all__ = ["SupportsMultiModal", "supports_multimodal"]


class SupportsMultiModal(ABC):
    """Contract (besides the decoder interface):

    - `multimodal_processor(path, hf_config)` (classmethod): the frontend's processor, read
      from the checkpoint directory `path` (its preprocessor_config.json) and its config.
    - `embed_multimodal(modality, items)`: one encoder output per item, a tensor
      [placeholder length, hidden_size] in the model's dtype, from the item's tensors as
      the processor made them (`MultiModalFeature.tensors()`).
    - `embed_input_ids(input_ids [T]) -> [T, hidden_size]`: the token embeddings.
    - `forward(input_ids, positions, ..., inputs_embeds=None)`: given `inputs_embeds`
      [T, hidden_size], they replace the embedding of `input_ids`.
    - `uses_mrope` and `mrope_positions(prompt_token_ids, features) -> (positions [3, P]
      int64, delta)` for M-RoPE models.
    """

    uses_mrope: ClassVar[bool] = False

    @classmethod
    @abstractmethod
    def multimodal_processor(cls, path: Path, hf_config: dict[str, Any]) -> MultiModalProcessor: ...

    @abstractmethod
    def embed_multimodal(
        self, modality: str, items: Sequence[dict[str, torch.Tensor]]
    ) -> list[torch.Tensor]: ...

    @abstractmethod
    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor: ...

    def mrope_positions(
        self, prompt_token_ids: Sequence[int], features: Sequence[MultiModalFeature]
    ) -> tuple[torch.Tensor, int]:
        raise NotImplementedError(f"{type(self).__name__} does not use M-RoPE")


def supports_multimodal(model_cls: type) -> bool:
    return isinstance(model_cls, type) and issubclass(model_cls, SupportsMultiModal)
