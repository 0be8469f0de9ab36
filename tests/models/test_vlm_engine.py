"""Vision-language models through the engine against transformers' greedy tokens (float32,
the tiny random checkpoints of core.testing.tiny_vlm): prompts with one and two images in
one batch with a text-only prompt, every step's budget 8 tokens so chunked prefill splits
image placeholder runs; the prefix cache telling images apart; an image shared by
concurrent requests encoded once.

The reference's inputs come from transformers alone: its processor (LLaVA) or its image
processor's patch grid (Qwen2-VL, whose processor needs torchvision's video side) expands
each placeholder, its image processor makes the pixels.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers
from PIL import Image

from core import LLM, SamplingParams
from core.testing.tiny_vlm import TINY_VLMS, reference_vlm, write_tiny_vlm

NUM_TOKENS = 4
GREEDY = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True)
BLOCK_SIZE = 4
STEP_TOKENS = 8
PLACEHOLDERS = {"llava": "<image>", "qwen": "<|vision_start|><|image_pad|><|vision_end|>"}


def noise(seed: int, height: int, width: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


IMAGES = [noise(0, 40, 60), noise(1, 70, 50), noise(2, 56, 56)]


class Reference:
    """transformers' model of a tiny checkpoint and its greedy tokens for a prompt."""

    def __init__(self, name: str, directory: Path) -> None:
        self.name = name
        self.family = "llava" if name.startswith("llava") else "qwen"
        self.model = reference_vlm(name)
        write_tiny_vlm(directory, name, self.model)
        self.tokenizer = transformers.PreTrainedTokenizerFast(
            tokenizer_file=str(directory / "tokenizer.json")
        )
        self.image_processor = transformers.AutoImageProcessor.from_pretrained(directory)
        self.config = self.model.config
        pad = "<image>" if self.family == "llava" else "<|image_pad|>"
        self.image_token_id = self.tokenizer.convert_tokens_to_ids(pad)

    def prompt(self, text: str) -> str:
        """`text` with each "IMAGE" the model's placeholder."""
        return text.replace("IMAGE", PLACEHOLDERS[self.family])

    def request(self, text: str, images: list[Image.Image]) -> str | dict[str, Any]:
        """The engine's prompt for `text` and `images` (a text prompt without images)."""
        prompt = self.prompt(text)
        return {"prompt": prompt, "multi_modal_data": {"image": images}} if images else prompt

    def inputs(self, text: str, images: list[Image.Image]) -> dict[str, torch.Tensor]:
        if self.family == "llava":
            return self._llava_inputs(self.prompt(text), images)
        return self._qwen_inputs(self.prompt(text), images)

    def _llava_inputs(self, text: str, images: list[Image.Image]) -> dict[str, torch.Tensor]:
        processor = transformers.LlavaProcessor(
            self.image_processor, self.tokenizer, patch_size=14, image_token="<image>",
            vision_feature_select_strategy=self.config.vision_feature_select_strategy,
            num_additional_image_tokens=int(self.config.vision_config.model_type.startswith("clip")),
        )  # fmt: skip
        out = processor(text=[text], images=images or None, return_tensors="pt")
        return {k: out[k] for k in ("input_ids", "pixel_values") if k in out}

    def _qwen_inputs(self, text: str, images: list[Image.Image]) -> dict[str, torch.Tensor]:
        pad = "<|image_pad|>"
        if not images:
            return {"input_ids": self.tokenizer(text, return_tensors="pt")["input_ids"]}
        pixels = self.image_processor(images=images, return_tensors="pt")
        merge = self.config.vision_config.spatial_merge_size
        pieces = text.split(pad)
        for grid, _ in zip(pixels["image_grid_thw"], images, strict=True):
            pieces[0] += pad * (int(grid.prod()) // merge**2) + pieces.pop(1)
        input_ids = self.tokenizer(pieces[0], return_tensors="pt")["input_ids"]
        # What transformers' processor adds: which positions are image tokens.
        mm_token_type_ids = (input_ids == self.image_token_id).int()
        return {"input_ids": input_ids, "mm_token_type_ids": mm_token_type_ids, **pixels}

    def greedy(self, text: str, images: list[Image.Image]) -> list[int]:
        """transformers' next NUM_TOKENS greedy tokens, end of sequence or not. (Its
        generate feeds the images to the prompt's forward only, as the engine does: a
        generated token that happens to be the image token is text.)"""
        inputs = self.inputs(text, images)
        length = inputs["input_ids"].shape[1]
        with torch.no_grad():
            out = self.model.generate(
                **inputs, max_new_tokens=NUM_TOKENS, do_sample=False, eos_token_id=None,
                pad_token_id=0,
            )  # fmt: skip
        return out[0, length:].tolist()


class Loaded:
    def __init__(self, name: str, directory: Path) -> None:
        self.reference = Reference(name, directory)
        self.llm = LLM(str(directory), dtype="float32", block_size=BLOCK_SIZE,
                       max_num_batched_tokens=STEP_TOKENS, max_model_len=128,
                       kv_cache_memory="8MiB")  # fmt: skip
        self.core = self.llm.engine.core

    def generate(self, prompts: list[tuple[str, list[Image.Image]]]):
        requests = [self.reference.request(*p) for p in prompts]
        return self.llm.generate(requests, GREEDY, use_tqdm=False)

    @property
    def runner(self):
        return self.core.executor.worker.runner


@pytest.fixture(scope="module", params=TINY_VLMS)
def loaded(request, tmp_path_factory) -> Iterator[Loaded]:
    engine = Loaded(request.param, tmp_path_factory.mktemp(request.param))
    yield engine
    engine.llm.engine.shutdown()


@contextmanager
def recorded_steps(loaded: Loaded) -> Iterator[list]:
    """Each step's (request id, first position, scheduled tokens) while the block runs."""
    scheduler = loaded.core.scheduler
    original, steps = scheduler.schedule, []

    def schedule():
        so = original()
        steps.append(
            [(r, scheduler.requests[r].num_computed_tokens - n, n)
             for r, n in so.num_scheduled_tokens.items()]
        )  # fmt: skip
        return so

    scheduler.schedule = schedule
    try:
        yield steps
    finally:
        scheduler.schedule = original


def splits_a_run(steps: list, features_of: dict[str, list]) -> bool:
    """Whether some step ended strictly inside an image's placeholder run."""
    for step in steps:
        for req_id, start, count in step:
            for feature in features_of.get(req_id, ()):
                if feature.placeholder.offset < start + count < feature.placeholder.end:
                    return True
    return False


def test_greedy_tokens_match_transformers_with_images_split_across_steps(loaded):
    prompts = [
        ("user: w1 IMAGE w2 w3 </s>assistant:", [IMAGES[0]]),
        ("user: w4 IMAGE w5 IMAGE w6 </s>assistant:", [IMAGES[1], IMAGES[0]]),
        ("user: w7 w8 w9 </s>assistant:", []),
        ("user: w1 w2 w3 w4 w5 IMAGE w6 </s>assistant:", [IMAGES[2]]),
    ]
    with recorded_steps(loaded) as steps:
        outputs = loaded.generate(prompts)
    got = [output.outputs[0].token_ids for output in outputs]
    assert got == [loaded.reference.greedy(text, images) for text, images in prompts]
    assert any(len(step) > 1 for step in steps)  # text-only and image prompts shared steps


def test_chunked_prefill_splits_an_image_run(loaded):
    # Words and an image no other test uses: nothing of it is in the prefix cache.
    TEXT, image = "user: w21 w22 w23 w24 IMAGE w26 </s>assistant:", noise(3, 60, 44)
    scheduler = loaded.core.scheduler
    captured: dict[str, list] = {}
    original_add = scheduler.add_request

    def add_request(request):
        captured[request.request_id] = request.mm_features
        original_add(request)

    scheduler.add_request = add_request
    try:
        with recorded_steps(loaded) as steps:
            output = loaded.generate([(TEXT, [image])])
    finally:
        scheduler.add_request = original_add
    assert splits_a_run(steps, captured)
    assert output[0].outputs[0].token_ids == loaded.reference.greedy(TEXT, [image])


def test_the_same_image_hits_the_prefix_cache_and_a_different_one_misses(loaded):
    text = "user: w30 w31 w32 IMAGE w33 w34 w35 w36 w37 w38 </s>assistant:"
    first = loaded.generate([(text, [IMAGES[0]])])[0]
    again = loaded.generate([(text, [IMAGES[0]])])[0]
    other = loaded.generate([(text, [IMAGES[1]])])[0]
    image_start = first.prompt_token_ids.index(loaded.reference.image_token_id)
    prompt_len = len(first.prompt_token_ids)
    assert again.num_cached_tokens == (prompt_len - 1) // BLOCK_SIZE * BLOCK_SIZE
    assert other.num_cached_tokens == image_start // BLOCK_SIZE * BLOCK_SIZE
    assert other.outputs[0].token_ids == loaded.reference.greedy(text, [IMAGES[1]])


def test_an_image_shared_by_concurrent_requests_is_encoded_once(loaded):
    scheduler, runner = loaded.core.scheduler, loaded.runner
    shared = noise(7, 48, 48)
    # Different first words: no request reaches another's blocks through the prefix cache.
    prompts = [(f"user: w{10 + i} IMAGE w20 </s>assistant:", [shared]) for i in range(4)]
    before = (scheduler.num_encoder_inputs, runner.mm_inputs.num_encoded)
    stats_before = scheduler.make_stats()
    outputs = loaded.generate(prompts)
    assert scheduler.num_encoder_inputs - before[0] == 1
    assert runner.mm_inputs.num_encoded - before[1] == 1
    stats = scheduler.make_stats()
    assert stats.mm_cache_queries - stats_before.mm_cache_queries == 4
    assert stats.mm_cache_hits - stats_before.mm_cache_hits == 3
    got = [output.outputs[0].token_ids for output in outputs]
    assert got == [loaded.reference.greedy(text, images) for text, images in prompts]


@pytest.mark.slow
def test_tensor_parallel_ranks_split_the_decoder_and_each_encode_the_image(tmp_path):
    reference = Reference("qwen2-vl", tmp_path)
    llm = LLM(str(tmp_path), dtype="float32", block_size=BLOCK_SIZE, tensor_parallel_size=2,
              max_num_batched_tokens=STEP_TOKENS, max_model_len=128,
              kv_cache_memory="8MiB")  # fmt: skip
    prompts = [("user: w1 IMAGE w2 w3 </s>assistant:", [IMAGES[1]]), ("user: w7 w8 </s>", [])]
    try:
        requests = [reference.request(text, images) for text, images in prompts]
        outputs = llm.generate(requests, GREEDY, use_tqdm=False)
    finally:
        llm.engine.shutdown()
    got = [output.outputs[0].token_ids for output in outputs]
    assert got == [reference.greedy(text, images) for text, images in prompts]
