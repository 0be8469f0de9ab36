"""A MultiModalProcessor over the tiny checkpoint's word vocabulary, for frontend tests that
need a model taking images before (or without) a vision model: each image is marked by the
word PLACEHOLDER and takes NUM_EMBEDS positions; its encoder input is its RGB bytes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from core.multimodal.processing import MultiModalProcessor, ProcessedItem
from core.testing.tiny_checkpoint import VOCAB

PLACEHOLDER = "w44"
NUM_EMBEDS = 2


class StandInImageProcessor(MultiModalProcessor):
    def placeholder_text(self, modality: str) -> str:
        return PLACEHOLDER

    def placeholder_token_id(self, modality: str) -> int:
        return VOCAB[PLACEHOLDER]

    def process(self, modality: str, items: Sequence[Any]) -> list[ProcessedItem]:
        return [ProcessedItem({"pixels": _rgb_bytes(image)}, NUM_EMBEDS) for image in items]


def _rgb_bytes(image: Any) -> torch.Tensor:
    # pixels: [H, W, 3] uint8
    data = torch.frombuffer(bytearray(image.convert("RGB").tobytes()), dtype=torch.uint8)
    return data.reshape(image.height, image.width, 3)
