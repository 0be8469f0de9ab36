"""Vision-language configs and processors: ArchConfig read from a nested `text_config`,
M-RoPE's rope parameters and rotary, and the clear errors for what the models refuse."""

from __future__ import annotations

import sys

import pytest
import torch
from PIL import Image

from core.models import ArchConfig
from core.models.layers import RotaryEmbedding
from core.models.llava import LlavaForConditionalGeneration
from core.models.qwen2_vl import Qwen2_5_VLForConditionalGeneration, Qwen2VLForConditionalGeneration
from core.testing.tiny_vlm import VOCAB, reference_config, write_tiny_vlm

MROPE = {"rope_type": "default", "mrope_section": [2, 3, 3]}


def hf_config(name: str, **top) -> dict:
    return {**reference_config(name).to_dict(), **top}


def test_nested_text_config_builds_the_decoder():
    raw = hf_config("llava-clip")
    config = ArchConfig.from_hf(raw)

    assert config.architectures == ("LlavaForConditionalGeneration",)
    assert (config.hidden_size, config.num_hidden_layers, config.head_dim) == (32, 2, 16)
    assert config.vocab_size == len(VOCAB) and config.eos_token_ids == (VOCAB["</s>"],)
    assert config.hf_config is raw  # the vision config stays reachable
    assert config == ArchConfig.from_hf({**raw, "vision_config": {}})  # not compared


@pytest.mark.parametrize(
    ("top", "text", "tied"),
    [(None, True, True), (True, False, True), (False, True, True), (False, False, False)],
)
def test_embeddings_are_tied_when_either_level_says_so(top, text, tied):
    raw = hf_config("qwen2-vl")
    raw["text_config"] = {**raw["text_config"], "tie_word_embeddings": text}
    raw = {k: v for k, v in raw.items() if k != "tie_word_embeddings"}
    if top is not None:
        raw["tie_word_embeddings"] = top

    assert ArchConfig.from_hf(raw).tie_word_embeddings is tied


def test_flat_config_is_read_as_before():
    flat = {**hf_config("qwen2-vl")["text_config"], "architectures": ["Qwen2ForCausalLM"]}
    assert ArchConfig.from_hf(flat).hidden_size == 32


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_parameters": {**MROPE, "rope_theta": 1e6}},  # transformers 5
        {"rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}, "rope_theta": 1e6},
    ],
)
def test_mrope_section_is_kept_in_rope_scaling(rope):
    text = {k: v for k, v in hf_config("qwen2-vl")["text_config"].items() if k != "rope_parameters"}
    config = ArchConfig.from_hf({**hf_config("qwen2-vl"), "text_config": {**text, **rope}})

    assert config.rope_theta == 1e6
    assert config.rope_scaling == MROPE


def test_mrope_with_equal_streams_is_plain_rope():
    rotary = RotaryEmbedding(16, 64, 10000.0, MROPE)
    positions = torch.tensor([0, 5, 9, 31])
    query, key = torch.randn(4, 2, 16), torch.randn(4, 1, 16)
    q1, k1, q3, k3 = query.clone(), key.clone(), query.clone(), key.clone()

    rotary(positions, q1, k1)
    rotary(positions.expand(3, -1), q3, k3)

    assert torch.equal(q1, q3) and torch.equal(k1, k3)
    assert not torch.equal(q1, query)


def test_mrope_sections_turn_by_their_own_stream():
    """Frequencies 0-1 turn by the time stream, 2-4 by height, 5-7 by width."""
    rotary = RotaryEmbedding(16, 64, 10000.0, MROPE)
    plain = RotaryEmbedding(16, 64, 10000.0)
    streams = torch.tensor([[3], [7], [11]])
    query, key = torch.randn(1, 1, 16), torch.randn(1, 1, 16)
    mixed = query.clone()
    rotary(streams, mixed, key.clone())

    for stream, freqs in enumerate([range(0, 2), range(2, 5), range(5, 8)]):
        alone = query.clone()
        plain(streams[stream], alone, key.clone())
        dims = [*freqs, *(f + 8 for f in freqs)]  # each frequency rotates dims f and f + 8
        torch.testing.assert_close(mixed[..., dims], alone[..., dims])


@pytest.mark.parametrize("section", [[2, 3, 4], [4, 4]])
def test_mrope_sections_must_cover_the_rotary_half(section):
    with pytest.raises(ValueError, match="mrope_section"):
        RotaryEmbedding(16, 64, 10000.0, {"rope_type": "default", "mrope_section": section})


def test_qwen2_vl_needs_mrope_sections():
    raw = hf_config("qwen2-vl")
    text = {**raw["text_config"], "rope_parameters": {"rope_type": "default"}}
    with pytest.raises(ValueError, match="mrope_section"):
        Qwen2VLForConditionalGeneration(ArchConfig.from_hf({**raw, "text_config": text}))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"vision_config": {"model_type": "dinov2"}}, "'vision_config.model_type' 'dinov2'"),
        ({"text_config": {"model_type": "gpt2"}}, "'text_config.model_type' 'gpt2'"),
        ({"vision_feature_layer": 3}, "'vision_feature_layer' 3"),
        ({"vision_feature_select_strategy": "cls"}, "'vision_feature_select_strategy' 'cls'"),
    ],
)
def test_llava_refuses_what_it_cannot_run(change, message):
    raw = hf_config("llava-clip")
    for key, value in change.items():  # merged into the nested dicts, so the rest stays valid
        raw[key] = {**raw[key], **value} if isinstance(value, dict) else value
    with pytest.raises(ValueError, match=message):
        LlavaForConditionalGeneration(ArchConfig.from_hf(raw))


def test_llava_processor_refuses_an_unknown_vision_encoder(tmp_path):
    raw = hf_config("llava-clip")
    raw["vision_config"] = {**raw["vision_config"], "model_type": "dinov2_model"}
    with pytest.raises(ValueError, match="'vision_config.model_type' 'dinov2_model'"):
        LlavaForConditionalGeneration.multimodal_processor(tmp_path, raw)


@pytest.mark.parametrize(
    ("model_class", "name"),
    [(LlavaForConditionalGeneration, "llava-siglip"),
     (Qwen2_5_VLForConditionalGeneration, "qwen2.5-vl")],
)  # fmt: skip
def test_missing_image_processor_config_is_named(tmp_path, model_class, name):
    with pytest.raises(ValueError, match="has no preprocessor_config.json"):
        model_class.multimodal_processor(tmp_path, hf_config(name))


def test_missing_transformers_names_the_extra(tmp_path, monkeypatch):
    raw = hf_config("qwen2-vl")
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers fails
    with pytest.raises(ValueError, match=r"pip install 'core\[vision\]'"):
        Qwen2VLForConditionalGeneration.multimodal_processor(tmp_path, raw)


@pytest.fixture(scope="module")
def qwen_processor(tmp_path_factory):
    directory = write_tiny_vlm(tmp_path_factory.mktemp("qwen2-vl"), "qwen2-vl")
    return Qwen2VLForConditionalGeneration.multimodal_processor(directory, hf_config("qwen2-vl"))


def test_processor_refuses_what_is_not_an_image(qwen_processor):
    with pytest.raises(ValueError, match=r"multi_modal_data.image\[1\]: expected a PIL image"):
        qwen_processor.process("image", [Image.new("RGB", (56, 56)), "cat.png"])


def test_processor_names_the_image_it_cannot_patch(qwen_processor):
    with pytest.raises(ValueError, match=r"multi_modal_data.image\[0\]: .*aspect ratio"):
        qwen_processor.process("image", [Image.new("RGB", (5000, 10))])


def test_qwen_processor_items(qwen_processor):
    (item,) = qwen_processor.process("image", [Image.new("RGB", (60, 40))])

    assert item.num_embeds == 6  # a 4 x 6 patch grid, merged 2 x 2
    assert item.data["image_grid_thw"].tolist() == [1, 4, 6]
    assert item.data["pixel_values"].shape == (24, 3 * 2 * 14 * 14)
    assert qwen_processor.placeholder_token_id("image") == VOCAB["<|image_pad|>"]
