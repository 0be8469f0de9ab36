"""Tiny random vision-language checkpoints that the whole engine loads in about a second:
LLaVA with a CLIP or a SigLIP encoder, Qwen2-VL and Qwen2.5-VL (`TINY_VLMS`).

Each is saved by transformers as safetensors, beside its image processor's
preprocessor_config.json and a word-level tokenizer whose ids a test can write down
(`VOCAB`: core.testing.tiny_checkpoint's words, plus the image tokens as special tokens).
The chat template renders plain string contents and OpenAI-style content lists, an image
part as the model's placeholder text. Images cost few positions: LLaVA's encoder takes
28x28 pixels (4 patches of 14, so 4 positions); Qwen2-VL's processor keeps an image
between 56x56 and 112x112 pixels (4 to 16 positions after its 2x2 merge).
Needs transformers and Pillow (core's test extra).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tokenizers
import torch
from tokenizers import models, pre_tokenizers

from core.models import llava, qwen2_vl
from core.testing.tiny_checkpoint import SPECIAL, WORDS

if TYPE_CHECKING:
    import transformers

__all__ = [
    "IMAGE_TOKENS",
    "SEED",
    "TINY_VLMS",
    "VOCAB",
    "reference_config",
    "reference_vlm",
    "write_tiny_vlm",
]

IMAGE_TOKENS = ["<image>", "<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>"]
VOCAB = {token: i for i, token in enumerate([*SPECIAL, *IMAGE_TOKENS, *WORDS])}
TINY_VLMS = ("llava-clip", "llava-siglip", "qwen2-vl", "qwen2.5-vl")
# The default weights' seed: one for which each model's next token after a one-image
# prompt differs between a black and a white image, and between two noise images
# (tests/models/test_vlm_parity.py checks it), so engine tests can tell images apart.
SEED = 2
_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: "
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for part in m['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }} "
    "{% elif part['type'] in ['image', 'image_url'] %}PLACEHOLDER {% endif %}"
    "{% endfor %}{% endif %}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
_TEXT = dict(  # the decoder: hidden 32, two heads of 16, one KV head
    vocab_size=len(VOCAB), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
    bos_token_id=VOCAB["<s>"], eos_token_id=VOCAB["</s>"], pad_token_id=None,
    tie_word_embeddings=False, initializer_range=0.5,
)  # fmt: skip
_VISION = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
               image_size=28, patch_size=14, initializer_range=0.5)  # fmt: skip
_QWEN_VISION = dict(depth=2, num_heads=2, patch_size=14, spatial_merge_size=2,
                    temporal_patch_size=2, initializer_range=0.5)  # fmt: skip


def reference_config(name: str) -> transformers.PreTrainedConfig:
    """The transformers config of `name` (one of TINY_VLMS): `.to_dict()` is what its
    config.json holds."""
    return _SPECS[name].config()[0]


def reference_vlm(name: str, seed: int = SEED) -> transformers.PreTrainedModel:
    """The transformers model of `name` (one of TINY_VLMS), eager attention, float32,
    seeded: every call with the same arguments gives the same weights. Every parameter
    is nudged off its initial value, so norms and biases are distinct."""
    import transformers

    config, model_class = _SPECS[name].config()
    config._attn_implementation = "eager"
    for sub_config in (config.text_config, config.vision_config):
        sub_config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.1)
    return model


def write_tiny_vlm(
    directory: Path, name: str, model: transformers.PreTrainedModel | None = None
) -> Path:
    """`model` (default: `reference_vlm(name)`), its image processor's config and its
    tokenizer (tokenizer.json, tokenizer_config.json with the chat template), written into
    `directory`."""
    (model or reference_vlm(name)).save_pretrained(directory)
    spec = _SPECS[name]
    spec.image_processor().save_pretrained(directory)
    backend = tokenizers.Tokenizer(models.WordLevel(VOCAB, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.add_special_tokens([*SPECIAL, *IMAGE_TOKENS])
    backend.save(str(directory / "tokenizer.json"))
    template = _CHAT_TEMPLATE.replace("PLACEHOLDER", spec.placeholder)
    config = {"bos_token": "<s>", "eos_token": "</s>", "chat_template": template}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def _llava_config(vision_model_type: str, **settings: Any) -> tuple[Any, str]:
    import transformers

    config = transformers.LlavaConfig(
        vision_config={"model_type": vision_model_type, **_VISION},
        image_token_index=VOCAB["<image>"],
        architectures=["LlavaForConditionalGeneration"],
        **settings,
    )
    return config, "LlavaForConditionalGeneration"


def _qwen_config(qwen2_5: bool) -> tuple[Any, str]:
    import transformers

    text = {**_TEXT, "rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3],
                                         "rope_theta": 10000.0}}  # fmt: skip
    if qwen2_5:  # window attention in block 0 (2x2 merge blocks a window), full in block 1
        vision = dict(hidden_size=32, out_hidden_size=32, intermediate_size=48, window_size=56,
                      fullatt_block_indexes=[1], **_QWEN_VISION)  # fmt: skip
    else:
        vision = dict(embed_dim=32, hidden_size=32, mlp_ratio=2, **_QWEN_VISION)
    config_class = transformers.Qwen2_5_VLConfig if qwen2_5 else transformers.Qwen2VLConfig
    architecture = (
        "Qwen2_5_VLForConditionalGeneration" if qwen2_5 else "Qwen2VLForConditionalGeneration"
    )
    config = config_class(
        text_config=text,
        vision_config=vision,
        image_token_id=VOCAB["<|image_pad|>"],
        video_token_id=VOCAB["<|video_pad|>"],
        vision_start_token_id=VOCAB["<|vision_start|>"],
        vision_end_token_id=VOCAB["<|vision_end|>"],
        architectures=[architecture],
    )
    return config, architecture


def _llava_clip() -> tuple[Any, str]:
    # Llama decoder; the second-to-last layer's patches, the class token dropped.
    return _llava_config("clip_vision_model", text_config={"model_type": "llama", **_TEXT})


def _llava_siglip() -> tuple[Any, str]:
    # LLaVA-Interleave's shape: a Qwen2 decoder and every token of two layers.
    return _llava_config(
        "siglip_vision_model",
        text_config={"model_type": "qwen2", **_TEXT},
        vision_feature_layer=[1, -1],
        vision_feature_select_strategy="full",
    )


def _clip_processor() -> Any:
    import transformers

    return transformers.CLIPImageProcessor(
        size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28}
    )


def _siglip_processor() -> Any:
    import transformers

    return transformers.SiglipImageProcessor(size={"height": 28, "width": 28})


def _qwen_processor() -> Any:
    import transformers

    return transformers.Qwen2VLImageProcessor(min_pixels=56 * 56, max_pixels=112 * 112)


@dataclass(frozen=True)
class _Spec:
    config: Callable[[], tuple[Any, str]]  # (transformers config, model class name)
    image_processor: Callable[[], Any]
    placeholder: str  # what an image part of a chat message renders as


_SPECS = {
    "llava-clip": _Spec(_llava_clip, _clip_processor, llava.PLACEHOLDER),
    "llava-siglip": _Spec(_llava_siglip, _siglip_processor, llava.PLACEHOLDER),
    "qwen2-vl": _Spec(lambda: _qwen_config(qwen2_5=False), _qwen_processor, qwen2_vl.PLACEHOLDER),
    "qwen2.5-vl": _Spec(lambda: _qwen_config(qwen2_5=True), _qwen_processor, qwen2_vl.PLACEHOLDER),
}
