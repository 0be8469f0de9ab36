"""Vision-language models against transformers, float32, on the tiny random checkpoints of
core.testing.tiny_vlm: each image's embeddings, the logits of a whole prompt with one or
two images merged in (through our processor and `process_prompt`, one sequence through a
dense attention), and Qwen2-VL's M-RoPE positions."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from model_harness import DenseAttentionBackend, assert_logits_match
from PIL import Image

from core.forward_context import ForwardContext, set_forward_context
from core.model_loader.safetensors_loader import load_safetensors_checkpoint
from core.models import build_model, iter_attention_layers
from core.models.qwen2_vl import mrope_positions
from core.multimodal.processing import ProcessedPrompt, process_prompt
from core.testing.tiny_vlm import TINY_VLMS, VOCAB, reference_vlm, write_tiny_vlm
from core.tokenizer import Tokenizer

W = [VOCAB[f"w{i}"] for i in range(45)]
IMAGE_SIZES = [(40, 60), (70, 50)]  # (height, width): Qwen2-VL patch grids 4x6 and 4x4
VISION_START, VISION_END = VOCAB["<|vision_start|>"], VOCAB["<|vision_end|>"]


class Loaded:
    """A tiny checkpoint on disk, transformers' model of it and ours, built by core's
    loader path (the registry's class for its architecture), and its processor."""

    def __init__(self, name: str, directory) -> None:
        self.reference = reference_vlm(name)
        write_tiny_vlm(directory, name, self.reference)
        self.checkpoint = load_safetensors_checkpoint(directory)
        self.model = build_model(self.checkpoint)
        self.processor = type(self.model).multimodal_processor(directory, self.checkpoint.hf_config)
        self.image_token_id = self.processor.placeholder_token_id("image")

    def prompt(self, num_images: int) -> list[int]:
        """<s> w1 w2 [image] w3 [image] w4 w5, with the first `num_images` images."""
        mark = [self.image_token_id]
        if self.model.uses_mrope:
            mark = [VISION_START, self.image_token_id, VISION_END]
        middle = [*mark, W[3], *mark] if num_images == 2 else [*mark, W[3]]
        return [VOCAB["<s>"], W[1], W[2], *middle, W[4], W[5]]

    def process(self, images: list[Image.Image]) -> ProcessedPrompt:
        return process_prompt(self.processor, self.prompt(len(images)), {"image": images}, {})


@pytest.fixture(scope="module", params=TINY_VLMS)
def loaded(request, tmp_path_factory) -> Loaded:
    return Loaded(request.param, tmp_path_factory.mktemp(request.param))


def images(*indices: int) -> list[Image.Image]:
    """Seeded noise images of IMAGE_SIZES."""
    rng = np.random.default_rng(0)
    pixels = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in IMAGE_SIZES]
    return [Image.fromarray(pixels[i]) for i in indices]


def our_logits(model, processed: ProcessedPrompt) -> torch.Tensor:
    """Logits [T, vocab] of the whole prompt: the images' embeddings merged into the token
    embeddings at their placeholders, at M-RoPE or plain positions."""
    input_ids = torch.tensor(processed.prompt_token_ids)
    with torch.inference_mode():
        embeds = model.embed_input_ids(input_ids).clone()
        encoded = model.embed_multimodal("image", [f.tensors() for f in processed.features])
        for feature, rows in zip(processed.features, encoded, strict=True):
            embeds[feature.placeholder.offset : feature.placeholder.end] = rows
    positions = torch.arange(len(input_ids))
    if model.uses_mrope:
        positions = model.mrope_positions(processed.prompt_token_ids, processed.features)[0]
    return run_dense(model, input_ids, positions, embeds)


def run_dense(model, input_ids, positions, inputs_embeds) -> torch.Tensor:
    layers = list(iter_attention_layers(model))
    for layer in layers:
        layer.bind_backend(DenseAttentionBackend)
        layer.kv_cache = torch.empty(0)
    context = ForwardContext({layer.layer_name: None for layer in layers}, len(input_ids))
    with torch.inference_mode(), set_forward_context(context):
        return model.compute_logits(model(input_ids, positions, inputs_embeds=inputs_embeds))


def reference_inputs(loaded: Loaded, processed: ProcessedPrompt) -> dict[str, torch.Tensor]:
    """transformers' forward inputs for the same expanded prompt and encoder inputs."""
    input_ids = torch.tensor([processed.prompt_token_ids])
    items = [feature.tensors() for feature in processed.features]
    if not loaded.model.uses_mrope:
        pixel_values = torch.stack([item["pixel_values"] for item in items])
        return dict(input_ids=input_ids, pixel_values=pixel_values)
    return dict(
        input_ids=input_ids,
        pixel_values=torch.cat([item["pixel_values"] for item in items]),
        image_grid_thw=torch.stack([item["image_grid_thw"] for item in items]),
        mm_token_type_ids=(input_ids == loaded.image_token_id).int(),
    )


@pytest.mark.parametrize("num_images", [1, 2])
def test_logits_match_transformers(loaded, num_images):
    processed = loaded.process(images(*range(num_images)))
    num_embeds = [feature.placeholder.length for feature in processed.features]
    assert len(num_embeds) == num_images and all(n >= 4 for n in num_embeds)

    got = our_logits(loaded.model, processed)

    with torch.inference_mode():
        want = loaded.reference(**reference_inputs(loaded, processed)).logits[0]
    assert got.shape == (len(processed.prompt_token_ids), len(VOCAB))
    assert_logits_match(got, want)


def test_image_embeddings_match_transformers(loaded):
    processed = loaded.process(images(0, 1))
    items = [feature.tensors() for feature in processed.features]

    with torch.inference_mode():
        got = loaded.model.embed_multimodal("image", items)
        inputs = reference_inputs(loaded, processed)
        inputs.pop("input_ids"), inputs.pop("mm_token_type_ids", None)
        want = loaded.reference.model.get_image_features(**inputs).pooler_output

    assert [g.shape for g in got] == [(f.placeholder.length, 32) for f in processed.features]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4 * w.abs().max().item())


@pytest.mark.parametrize("pair", ["black-white", "noise"])
def test_the_image_decides_the_next_token(loaded, pair):
    """The tiny checkpoints' promise: the greedy token after the prompt depends on the
    image (tiny_vlm.SEED was chosen for it)."""
    black_white = [Image.new("RGB", (60, 40), (v, v, v)) for v in (0, 255)]
    pictures = black_white if pair == "black-white" else images(0, 1)
    logits = [our_logits(loaded.model, loaded.process([picture])) for picture in pictures]
    assert logits[0][-1].argmax() != logits[1][-1].argmax()


SPELLINGS = {  # checkpoint tensor names -> another spelling of them
    "saved": lambda name: name,  # transformers 4's names, which transformers 5 saves too
    "clip-vision-model-prefix": lambda name: name.replace(  # transformers 4's LLaVA tower
        "vision_tower.", "vision_tower.vision_model."
    ),
}


@pytest.mark.parametrize("spelling", [*SPELLINGS, "in-memory"])
def test_loads_every_weight_spelling(loaded, spelling):
    """The tensors as saved, as transformers 4 named a LLaVA encoder's, and as
    transformers 5 names them in memory load into the same model."""
    if spelling == "in-memory":
        weights = loaded.reference.state_dict().items()
    else:
        saved = loaded.checkpoint.iter_weights(torch.float32)
        weights = ((SPELLINGS[spelling](name), tensor) for name, tensor in saved)
    model = type(loaded.model)(loaded.model.config)
    model.load_weights(weights)
    processed = loaded.process(images(0))

    assert torch.equal(our_logits(model, processed), our_logits(loaded.model, processed))


def test_chat_template_renders_image_parts_as_placeholders(loaded):
    tokenizer = Tokenizer.from_dir(loaded.checkpoint.path)
    content = [
        {"type": "text", "text": "w1 w2"},
        {"type": "image"},
        {"type": "text", "text": "w3"},
        {"type": "image"},
    ]
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": content}])
    token_ids = tokenizer.encode(prompt)

    assert token_ids.count(loaded.image_token_id) == 2
    processed = loaded.process(images(0, 1))  # the same two images
    expanded = process_prompt(loaded.processor, token_ids, {"image": images(0, 1)}, {})
    assert [f.identifier for f in expanded.features] == [f.identifier for f in processed.features]
    plain = tokenizer.apply_chat_template([{"role": "user", "content": "w1 w2"}])
    assert tokenizer.encode(plain)[:4] == [VOCAB["user"], VOCAB[":"], W[1], W[2]]


# -- M-RoPE positions -----------------------------------------------------------------------

GRIDS = [(1, 4, 6), (1, 4, 4), (1, 8, 2)]  # (t, h, w) patches: 6, 4 and 4 positions


def rope_case(layout: str) -> tuple[list[int], list[tuple[int, tuple[int, int, int]]]]:
    """A Qwen2-VL prompt from a layout: "t" a text token, a digit image GRIDS[digit]
    between <|vision_start|> and <|vision_end|>; and its images' (offset, grid)."""
    token_ids: list[int] = []
    placed = []
    for mark in layout:
        if mark == "t":
            token_ids.append(W[len(token_ids) % 45])
            continue
        grid = GRIDS[int(mark)]
        token_ids.append(VISION_START)
        placed.append((len(token_ids), grid))
        token_ids.extend([VOCAB["<|image_pad|>"]] * (grid[0] * grid[1] * grid[2] // 4))
        token_ids.append(VISION_END)
    return token_ids, placed


@pytest.fixture(scope="module")
def qwen2_vl() -> torch.nn.Module:
    return reference_vlm("qwen2-vl")


@pytest.mark.parametrize("layout", ["tt0ttt1tt", "0tt", "tt2", "t1t0t2t", "tttt"])
def test_mrope_positions_match_get_rope_index(qwen2_vl, layout):
    token_ids, placed = rope_case(layout)
    input_ids = torch.tensor([token_ids])
    grids = torch.tensor([grid for _, grid in placed], dtype=torch.int64).view(-1, 3)

    positions, delta = mrope_positions(len(token_ids), placed, merge_size=2)

    is_image = (input_ids == VOCAB["<|image_pad|>"]).int()
    want, want_delta = qwen2_vl.model.get_rope_index(input_ids, is_image, grids)
    assert torch.equal(positions, want[:, 0])
    assert delta == int(want_delta)
    # A generated token continues the prompt's positions, delta away from its index.
    extended = torch.tensor([[*token_ids, W[7]]])
    after, _ = qwen2_vl.model.get_rope_index(
        extended, (extended == VOCAB["<|image_pad|>"]).int(), grids
    )
    assert after[:, 0, -1].tolist() == [len(token_ids) + delta] * 3


@pytest.mark.parametrize("loaded", ["qwen2-vl", "qwen2.5-vl"], indirect=True)
def test_model_mrope_positions_read_the_features(loaded):
    processed = loaded.process(images(0, 1))
    grids = [tuple(f.tensors()["image_grid_thw"].tolist()) for f in processed.features]
    placed = [(f.placeholder.offset, g) for f, g in zip(processed.features, grids, strict=True)]

    got = loaded.model.mrope_positions(processed.prompt_token_ids, processed.features)

    want = mrope_positions(len(processed.prompt_token_ids), placed, merge_size=2)
    assert torch.equal(got[0], want[0]) and got[1] == want[1]
    assert grids == [(1, 4, 6), (1, 4, 4)]
