"""HFImageProcessor: a vision model's multimodal processor around the transformers image
processor its checkpoint names (preprocessor_config.json).

Images go through transformers (and Pillow) exactly as the model was trained on them; both
are optional dependencies of core, imported only when a vision model is served.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from core.multimodal.processing import MultiModalProcessor, ProcessedItem

__all__ = ["HFImageProcessor"]

_INSTALL = "pip install 'core[vision]'"
_CONFIG_FILE = "preprocessor_config.json"


class HFImageProcessor(MultiModalProcessor):
    """Images, one at a time, through the checkpoint's transformers image processor;
    `to_item` turns its output for one image (tensors by name, a batch of one) into the
    item's encoder inputs and embedding count, or raises ValueError.

    Built from the checkpoint directory `path`: ValueError naming `model` when it has no
    preprocessor_config.json, or when transformers or Pillow is missing.
    """

    modalities = ("image",)

    def __init__(
        self,
        path: Path,
        model: str,
        placeholder_text: str,
        placeholder_token_id: int,
        to_item: Callable[[Mapping[str, torch.Tensor]], ProcessedItem],
    ) -> None:
        self._hf_processor = _load(Path(path), model)
        self._placeholder_text = placeholder_text
        self._placeholder_token_id = placeholder_token_id
        self._to_item = to_item

    def placeholder_text(self, modality: str) -> str:
        return self._placeholder_text

    def placeholder_token_id(self, modality: str) -> int:
        return self._placeholder_token_id

    def process(self, modality: str, items: Sequence[Any]) -> list[ProcessedItem]:
        from PIL import Image

        processed = []
        for i, item in enumerate(items):
            where = f"multi_modal_data.{modality}[{i}]"
            if not isinstance(item, Image.Image):
                raise ValueError(f"{where}: expected a PIL image, got {type(item).__name__}")
            try:
                outputs = self._hf_processor(images=[item], return_tensors="pt")
                processed.append(self._to_item(outputs))
            except ValueError as exc:  # e.g. an image too small or too elongated to patch
                raise ValueError(f"{where}: {exc}") from exc
        return processed


def _load(path: Path, model: str) -> Any:
    """The transformers image processor of the checkpoint directory `path`."""
    try:
        import PIL  # noqa: F401  (transformers' image processors need it)
        import transformers
    except ImportError as exc:
        raise ValueError(
            f"{model} takes images through transformers and Pillow: {_INSTALL}"
        ) from exc
    if not (path / _CONFIG_FILE).is_file():
        raise ValueError(
            f"{model} needs its checkpoint's image processor: {path} has no {_CONFIG_FILE}"
        )
    return transformers.AutoImageProcessor.from_pretrained(path)
