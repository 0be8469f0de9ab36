"""Qwen2-VL and Qwen2.5-VL (transformers' Qwen2VLForConditionalGeneration and
Qwen2_5_VLForConditionalGeneration): their vision transformer (core.models.qwen2_vl_vision)
feeding the Qwen2 decoder, which rotates by M-RoPE.

An image keeps its aspect ratio: Qwen2VLImageProcessor resizes it to a multiple of
patch_size * merge_size a side, within its min / max pixels, so it takes t * h * w /
merge_size**2 prompt positions for a (t, h, w) patch grid, marked by `<|image_pad|>`
(`image_token_id`) between `<|vision_start|>` and `<|vision_end|>`.

M-RoPE positions (transformers' `get_rope_index`): text tokens count up by one in all
three streams; an image starting at position s puts its block (i, j) of frame f at
(s + f, s + i, s + j), and the text after it resumes at s + max(h, w) / merge_size.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch

from core.models.arch_config import ArchConfig
from core.models.image_processor import HFImageProcessor
from core.models.qwen2 import Qwen2ForCausalLM
from core.models.qwen2_vl_vision import Grid, Qwen2VisionConfig, Qwen2VisionTransformer
from core.models.vision_language import VisionLanguageModel
from core.multimodal.inputs import MultiModalFeature
from core.multimodal.processing import MultiModalProcessor, ProcessedItem
from core.quantization.interface import QuantizationConfig

PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"


class Qwen2VLForConditionalGeneration(VisionLanguageModel):
    """Images (not videos). Items: {"pixel_values": [num_patches, C*T*P*P],
    "image_grid_thw": [3] int64}, as Qwen2VLImageProcessor makes them.

    Refuses (ValueError) a config without M-RoPE sections or image token id.
    """

    uses_mrope = True
    qwen2_5: ClassVar[bool] = False  # which vision transformer
    vision_modules = ("visual",)
    weight_renames = (
        ("model.visual.", "visual."),  # transformers 5, in memory
        ("model.language_model.", "language_model.model."),
        ("model.", "language_model.model."),  # as saved (and transformers 4)
        ("lm_head.", "language_model.lm_head."),
    )

    def __init__(
        self,
        config: ArchConfig,
        quant_config: QuantizationConfig | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        if "mrope_section" not in (config.rope_scaling or {}):
            raise ValueError(
                f"{type(self).__name__}: config 'rope_parameters' (or 'rope_scaling') has no "
                "'mrope_section'"
            )
        super().__init__(config, Qwen2ForCausalLM(config, quant_config, dtype))
        vision = self._vision_config(config.hf_config)
        self.merge_size = vision.spatial_merge_size
        self.visual = Qwen2VisionTransformer(vision, dtype)

    @classmethod
    def multimodal_processor(cls, path: Path, hf_config: dict[str, Any]) -> MultiModalProcessor:
        merge_size = cls._vision_config(hf_config).spatial_merge_size

        def to_item(outputs: Mapping[str, torch.Tensor]) -> ProcessedItem:
            grid = outputs["image_grid_thw"][0]  # [3]
            data = {"pixel_values": outputs["pixel_values"], "image_grid_thw": grid}
            return ProcessedItem(data, int(grid.prod()) // merge_size**2)

        return HFImageProcessor(
            path, cls.__name__, PLACEHOLDER, _image_token_id(cls, hf_config), to_item
        )

    @classmethod
    def _vision_config(cls, hf_config: dict[str, Any]) -> Qwen2VisionConfig:
        if not isinstance(hf_config.get("vision_config"), dict):
            raise ValueError(f"{cls.__name__}: the model config has no 'vision_config'")
        return Qwen2VisionConfig.from_hf(hf_config["vision_config"], cls.qwen2_5)

    def embed_multimodal(
        self, modality: str, items: Sequence[dict[str, torch.Tensor]]
    ) -> list[torch.Tensor]:
        grids = [_grid(item["image_grid_thw"]) for item in items]
        pixel_values = self._vision_input(torch.cat([item["pixel_values"] for item in items]))
        embeds = self.visual(pixel_values, grids)  # [sum of placeholder lengths, hidden]
        return list(embeds.split([t * h * w // self.merge_size**2 for t, h, w in grids]))

    def mrope_positions(
        self, prompt_token_ids: Sequence[int], features: Sequence[MultiModalFeature]
    ) -> tuple[torch.Tensor, int]:
        images = [
            (feature.placeholder.offset, _grid(feature.data["image_grid_thw"].to_tensor()))
            for feature in features
        ]
        return mrope_positions(len(prompt_token_ids), images, self.merge_size)


class Qwen2_5_VLForConditionalGeneration(Qwen2VLForConditionalGeneration):
    """Qwen2.5-VL: Qwen2-VL with window attention, RMSNorm and a gated MLP in the vision
    transformer (the decoder and its M-RoPE are the same)."""

    qwen2_5 = True


def mrope_positions(
    num_tokens: int, images: Sequence[tuple[int, Grid]], merge_size: int
) -> tuple[torch.Tensor, int]:
    """M-RoPE positions [3, num_tokens] int64 of a prompt whose images start at the given
    offsets with the given patch grids, and the delta: generated token p >= num_tokens is
    at p + delta in all three streams (the prompt's largest position + 1 - num_tokens)."""
    chunks, start, cursor = [], 0, 0
    for offset, (t, h, w) in sorted(images):
        chunks.append(_text_positions(start, offset - cursor))
        start += offset - cursor
        rows, cols = h // merge_size, w // merge_size
        grid = torch.meshgrid(
            torch.arange(t), torch.arange(rows), torch.arange(cols), indexing="ij"
        )
        chunks.append(torch.stack(grid).flatten(1) + start)  # [3, t * rows * cols]
        start += max(rows, cols)
        cursor = offset + t * rows * cols
    chunks.append(_text_positions(start, num_tokens - cursor))
    positions = torch.cat(chunks, dim=1)
    return positions, int(positions.max()) + 1 - num_tokens


def _text_positions(start: int, num_tokens: int) -> torch.Tensor:  # [3, num_tokens]
    return torch.arange(start, start + num_tokens).expand(3, num_tokens)


def _grid(image_grid_thw: torch.Tensor) -> Grid:
    t, h, w = (int(v) for v in image_grid_thw)
    return t, h, w


def _image_token_id(model: type, hf_config: dict[str, Any]) -> int:
    if hf_config.get("image_token_id") is None:
        raise ValueError(f"{model.__name__}: config has no 'image_token_id'")
    return int(hf_config["image_token_id"])
