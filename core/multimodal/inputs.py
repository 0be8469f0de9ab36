"""The multimodal data a request carries from the frontend to the workers.

msgspec structs, so they cross the frontend -> engine core socket and the scheduler ->
worker one unchanged: tensors travel as `TensorData` (dtype, shape, raw bytes), made back
into torch tensors where the model needs them.
"""

from __future__ import annotations

import msgspec
import numpy as np
import torch

__all__ = ["MultiModalFeature", "PlaceholderRange", "TensorData"]


class TensorData(msgspec.Struct, array_like=True, frozen=True):
    """A tensor as bytes: what a processor made, sent to the worker that encodes it."""

    dtype: str  # a torch dtype's name without "torch.": "float32", "int64"...
    shape: tuple[int, ...]
    data: bytes

    @classmethod
    def from_tensor(cls, tensor: torch.Tensor) -> TensorData:
        contiguous = tensor.detach().cpu().contiguous()
        raw = contiguous.reshape(-1).view(torch.uint8).numpy().tobytes()
        return cls(str(contiguous.dtype).removeprefix("torch."), tuple(contiguous.shape), raw)

    def to_tensor(self) -> torch.Tensor:
        dtype = getattr(torch, self.dtype)
        flat = torch.from_numpy(np.frombuffer(self.data, dtype=np.uint8).copy())
        return flat.view(dtype).reshape(self.shape)


class PlaceholderRange(msgspec.Struct, array_like=True, frozen=True):
    """Where an item's embeddings go: prompt positions offset .. offset + length - 1, each
    taking one row of the item's encoder output."""

    offset: int
    length: int

    @property
    def end(self) -> int:
        return self.offset + self.length


class MultiModalFeature(msgspec.Struct, array_like=True, frozen=True):
    """One item of a request (an image), processed.

    `identifier` is the hash of the item's content and of how it was processed: equal
    identifiers mean equal encoder outputs, so it keys the encoder cache (one encoding
    shared by every request with that image) and goes into the block hashes of the blocks
    its placeholder covers (two prompts differing only by image never share KV). `data`
    holds the model's encoder inputs for this item by name (pixel_values, image_grid_thw...).
    """

    modality: str
    identifier: str
    placeholder: PlaceholderRange
    data: dict[str, TensorData]

    def tensors(self) -> dict[str, torch.Tensor]:
        return {name: value.to_tensor() for name, value in self.data.items()}
