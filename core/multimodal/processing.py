"""The model's frontend half of multimodal input: items in, encoder inputs and placeholder
runs out.

A prompt marks where each item goes with one placeholder token (the model's: `<image>`,
`<|image_pad|>`); `process_prompt` expands each mark to the run of positions the item's
embeddings take and hashes each item's encoder inputs into its identifier. A model class
that takes images provides its processor (core.models.multimodal.SupportsMultiModal).
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from core.multimodal.inputs import MultiModalFeature, PlaceholderRange, TensorData

__all__ = [
    "DEFAULT_ITEM_LIMIT",
    "MultiModalProcessor",
    "ProcessedItem",
    "ProcessedPrompt",
    "hash_item",
    "item_list",
    "process_prompt",
]

# Items of one modality a prompt may carry when --limit-mm-per-prompt does not say (vLLM's).
DEFAULT_ITEM_LIMIT = 999


@dataclass(frozen=True)
class ProcessedItem:
    """One item's encoder inputs and how many prompt positions its embeddings take."""

    data: dict[str, torch.Tensor]
    num_embeds: int


@dataclass(frozen=True)
class ProcessedPrompt:
    prompt_token_ids: list[int]
    features: list[MultiModalFeature]  # in prompt order


class MultiModalProcessor(ABC):
    """Contract of a model's multimodal processor (one per served model, in the frontend):

    - `modalities`: the modalities the model takes ("image").
    - `placeholder_text(modality)`: what an item of a chat message becomes in the text the
      chat template renders (its tokens hold exactly one `placeholder_token_id`).
    - `placeholder_token_id(modality)`: the token marking an item's place in a prompt.
    - `process(modality, items)`: each item's encoder inputs (tensors, as the model's
      `embed_multimodal` takes them) and its number of embeddings, in the items' order;
      ValueError naming `multi_modal_data.<modality>` for an item it cannot take.
    """

    modalities: tuple[str, ...] = ("image",)

    @abstractmethod
    def placeholder_text(self, modality: str) -> str: ...

    @abstractmethod
    def placeholder_token_id(self, modality: str) -> int: ...

    @abstractmethod
    def process(self, modality: str, items: Sequence[Any]) -> list[ProcessedItem]: ...


def item_list(modality: str, value: Any) -> list[Any]:
    """One item or a list of them, as a list."""
    if isinstance(value, list | tuple):
        return list(value)
    if value is None:
        raise ValueError(f"multi_modal_data.{modality} must not be None")
    return [value]


def hash_item(modality: str, data: Mapping[str, torch.Tensor]) -> str:
    """The identifier of an item: sha256 of its encoder inputs (names, dtypes, shapes and
    values), so equal inputs, however the image arrived, share one encoding and KV."""
    digest = hashlib.sha256(modality.encode())
    for name in sorted(data):
        tensor = data[name].detach().cpu().contiguous()
        digest.update(f"|{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def process_prompt(
    processor: MultiModalProcessor,
    prompt_token_ids: Sequence[int],
    mm_data: Mapping[str, Any],
    limits: Mapping[str, int],
) -> ProcessedPrompt:
    """Expand each item's placeholder token in `prompt_token_ids` to its run of positions.

    The prompt must hold one placeholder per item, in the items' order per modality.
    ValueError naming `multi_modal_data.<modality>` for a modality the model does not
    take or more items than `limits` allows, and `prompt` when the placeholders and the
    items do not match in number.
    """
    items = {modality: item_list(modality, value) for modality, value in mm_data.items()}
    for modality, values in items.items():
        if modality not in processor.modalities:
            raise ValueError(
                f"multi_modal_data.{modality}: this model takes {list(processor.modalities)}"
            )
        limit = limits.get(modality, DEFAULT_ITEM_LIMIT)
        if len(values) > limit:
            raise ValueError(
                f"multi_modal_data.{modality}: {len(values)} items, more than the "
                f"{limit} a prompt may have (--limit-mm-per-prompt)"
            )
    marks = {processor.placeholder_token_id(m): m for m in processor.modalities}
    found: dict[str, list[int]] = {m: [] for m in processor.modalities}
    for position, token_id in enumerate(prompt_token_ids):
        if token_id in marks:
            found[marks[token_id]].append(position)
    for modality in processor.modalities:
        given = len(items.get(modality, ()))
        if len(found[modality]) != given:
            raise ValueError(
                f"prompt has {len(found[modality])} {modality} placeholder(s) "
                f"({processor.placeholder_text(modality)!r}) for {given} item(s) in "
                f"multi_modal_data.{modality}"
            )
    processed = {m: processor.process(m, values) for m, values in items.items() if values}
    at = {
        position: (modality, item)
        for modality, positions in found.items()
        for position, item in zip(positions, processed.get(modality, ()), strict=True)
    }
    token_ids: list[int] = []
    features: list[MultiModalFeature] = []
    for position, token_id in enumerate(prompt_token_ids):
        if position not in at:
            token_ids.append(token_id)
            continue
        modality, item = at[position]
        placeholder = PlaceholderRange(len(token_ids), item.num_embeds)
        data = {name: TensorData.from_tensor(t) for name, t in item.data.items()}
        features.append(
            MultiModalFeature(modality, hash_item(modality, item.data), placeholder, data)
        )
        token_ids.extend([token_id] * item.num_embeds)
    return ProcessedPrompt(token_ids, features)
