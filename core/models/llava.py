"""LLaVA (transformers' LlavaForConditionalGeneration): a CLIP or SigLIP image encoder whose
patch features a two-layer projector maps into the embedding space of a Llama, Mistral or
Qwen2 decoder.

The image processor resizes every image to the encoder's one size, so an image always
takes the same number of prompt positions, one per encoder token read: the patches, and
CLIP's class token, less the first token under the "default" feature strategy (as
transformers drops it, whichever encoder). `image_token_index` ("<image>") marks them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from core.models.arch_config import ArchConfig
from core.models.clip_vision import ClipVisionConfig, ClipVisionTower
from core.models.image_processor import HFImageProcessor
from core.models.layers.vision import vision_activation
from core.models.llama import LlamaForCausalLM
from core.models.mistral import MistralForCausalLM
from core.models.qwen2 import Qwen2ForCausalLM
from core.models.vision_language import VisionLanguageModel
from core.multimodal.processing import MultiModalProcessor, ProcessedItem
from core.quantization.interface import QuantizationConfig

PLACEHOLDER = "<image>"
# The decoders by the text config's model_type (transformers' default: llama).
_DECODERS: dict[str, type[LlamaForCausalLM]] = {
    "llama": LlamaForCausalLM,
    "mistral": MistralForCausalLM,
    "qwen2": Qwen2ForCausalLM,
}
_STRATEGIES = ("default", "full")  # vision_feature_select_strategy: drop the first token, or not


class _Projector(nn.Module):
    """linear_2(act(linear_1(features))): encoder features into the decoder's embeddings."""

    def __init__(
        self,
        in_features: int,
        hidden_size: int,
        act: Callable[[torch.Tensor], torch.Tensor],
        bias: bool,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(in_features, hidden_size, bias=bias, dtype=dtype)
        self.act = act
        self.linear_2 = nn.Linear(hidden_size, hidden_size, bias=bias, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., hidden]
        return self.linear_2(self.act(self.linear_1(x)))


class LlavaForConditionalGeneration(VisionLanguageModel):
    """LLaVA-1.5 and the checkpoints of its format (a SigLIP encoder and a Qwen2 decoder:
    LLaVA-Interleave). Items: {"pixel_values": [C, S, S]}, S the encoder's image size.

    Refuses (ValueError) an encoder other than CLIP's or SigLIP's, a decoder other than
    Llama, Mistral or Qwen2, and feature layers or a strategy transformers would not take.
    """

    vision_modules = ("vision_tower", "multi_modal_projector")
    weight_renames = (
        ("model.language_model.", "language_model.model."),  # transformers 5, in memory
        ("model.vision_tower.", "vision_tower."),
        ("model.multi_modal_projector.", "multi_modal_projector."),
        ("lm_head.", "language_model.lm_head."),
        ("vision_tower.vision_model.", "vision_tower."),  # transformers 4
    )

    def __init__(
        self,
        config: ArchConfig,
        quant_config: QuantizationConfig | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        hf_config = config.hf_config
        super().__init__(config, _decoder_class(hf_config)(config, quant_config, dtype))
        vision = _vision_config(hf_config)
        self.feature_layers = _feature_layers(hf_config, vision.num_hidden_layers)
        self.drops_first_token = _drops_first_token(hf_config)
        self.vision_tower = ClipVisionTower(vision, max(self.feature_layers), dtype)
        act = vision_activation(
            hf_config.get("projector_hidden_act", "gelu"), "projector_hidden_act"
        )
        self.multi_modal_projector = _Projector(
            vision.hidden_size * len(self.feature_layers),
            config.hidden_size,
            act,
            bool(hf_config.get("multimodal_projector_bias", True)),
            dtype,
        )

    @classmethod
    def multimodal_processor(cls, path: Path, hf_config: dict[str, Any]) -> MultiModalProcessor:
        vision = _vision_config(hf_config)
        num_embeds = (
            vision.num_patches + int(vision.class_token) - int(_drops_first_token(hf_config))
        )
        shape = (vision.num_channels, vision.image_size, vision.image_size)

        def to_item(outputs: Mapping[str, torch.Tensor]) -> ProcessedItem:
            pixel_values = outputs["pixel_values"][0]
            if tuple(pixel_values.shape) != shape:
                raise ValueError(
                    f"the image processor made pixel_values of shape "
                    f"{tuple(pixel_values.shape)}; the vision encoder takes {shape}"
                )
            return ProcessedItem({"pixel_values": pixel_values}, num_embeds)

        return HFImageProcessor(
            path, cls.__name__, PLACEHOLDER, _image_token_id(hf_config), to_item
        )

    def embed_multimodal(
        self, modality: str, items: Sequence[dict[str, torch.Tensor]]
    ) -> list[torch.Tensor]:
        pixel_values = self._vision_input(torch.stack([item["pixel_values"] for item in items]))
        features = self.vision_tower(pixel_values, self.feature_layers)  # [B, N, W * layers]
        if self.drops_first_token:
            features = features[:, 1:]
        return list(self.multi_modal_projector(features).unbind(0))  # B of [n, hidden]

    def _skips_vision_weight(self, name: str) -> bool:
        """The encoder's final norm, SigLIP's pooling head and the layers past the last
        one read are not built: LLaVA reads inner hidden states."""
        parts = name.split(".")
        if parts[0] != "vision_tower":
            return False
        if parts[1] in ("post_layernorm", "head"):
            return True
        num_layers = len(self.vision_tower.encoder["layers"])
        return parts[1:3] == ["encoder", "layers"] and int(parts[3]) >= num_layers


def _decoder_class(hf_config: dict[str, Any]) -> type[LlamaForCausalLM]:
    model_type = (hf_config.get("text_config") or {}).get("model_type", "llama")
    if model_type not in _DECODERS:
        raise ValueError(
            f"config 'text_config.model_type' {model_type!r} is not supported by "
            f"LlavaForConditionalGeneration (one of {sorted(_DECODERS)})"
        )
    return _DECODERS[model_type]


def _vision_config(hf_config: dict[str, Any]) -> ClipVisionConfig:
    if not isinstance(hf_config.get("vision_config"), dict):
        raise ValueError("LlavaForConditionalGeneration: the model config has no 'vision_config'")
    return ClipVisionConfig.from_hf(hf_config["vision_config"], "LlavaForConditionalGeneration")


def _feature_layers(hf_config: dict[str, Any], num_layers: int) -> list[int]:
    """`vision_feature_layer`, an index or a list of them into the encoder's hidden states
    (0 the embeddings, i the output of layer i, negative from the end), as indices >= 0."""
    value = hf_config.get("vision_feature_layer", -2)
    layers = [value] if isinstance(value, int) else list(value)
    resolved = [layer + num_layers + 1 if layer < 0 else layer for layer in layers]
    if not layers or not all(0 <= layer <= num_layers for layer in resolved):
        raise ValueError(
            f"config 'vision_feature_layer' {value!r} should index the {num_layers + 1} hidden "
            f"states of the {num_layers}-layer vision encoder"
        )
    return resolved


def _drops_first_token(hf_config: dict[str, Any]) -> bool:
    strategy = hf_config.get("vision_feature_select_strategy", "default")
    if strategy not in _STRATEGIES:
        raise ValueError(
            f"config 'vision_feature_select_strategy' {strategy!r} should be one of {_STRATEGIES}"
        )
    return strategy == "default"


def _image_token_id(hf_config: dict[str, Any]) -> int:
    """`image_token_index` (transformers 5 reads `image_token_id` as its alias)."""
    value = hf_config.get("image_token_index", hf_config.get("image_token_id"))
    if value is None:
        raise ValueError("LlavaForConditionalGeneration: config has no 'image_token_index'")
    return int(value)
