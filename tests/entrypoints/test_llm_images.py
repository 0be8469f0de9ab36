"""Images through the offline API: LLM.generate with vLLM's multi_modal_data and LLM.chat with
image parts (image_pil, data, file and http URLs) reach the same engine request and the same
greedy output; a bad image or a model without images is a ValueError naming the field.
On the tiny LLaVA checkpoint (core.testing.tiny_vlm), whose template loops over content."""

from __future__ import annotations

import io

import pytest
from image_server import RED_PNG, ImageServer, data_url, png_bytes
from PIL import Image
from tiny_engine_checkpoint import engine_kwargs, write_tiny_checkpoint

from core import LLM, SamplingParams
from core.models.llava import PLACEHOLDER
from core.testing.tiny_vlm import write_tiny_vlm

GREEDY = SamplingParams(temperature=0.0, max_tokens=4)
WHITE = Image.new("RGB", (28, 28), (255, 255, 255))
BLACK = Image.new("RGB", (28, 28), (0, 0, 0))
PROMPT = f"user: {PLACEHOLDER} w1 w2 </s>assistant:"  # what the chat template renders


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("media")
    (root / "white.png").write_bytes(png_bytes(WHITE))
    return root


@pytest.fixture(scope="module")
def llm(tmp_path_factory, media_dir) -> LLM:
    model_dir = write_tiny_vlm(tmp_path_factory.mktemp("llava"), "llava-clip")
    return LLM(str(model_dir), dtype="float32", max_model_len=128, kv_cache_memory="4MiB",
               allowed_local_media_path=str(media_dir))  # fmt: skip


def ask(*parts: dict) -> list[dict]:
    return [{"role": "user", "content": [*parts, {"type": "text", "text": "w1 w2"}]}]


def pil(image: Image.Image) -> dict:
    return {"type": "image_pil", "image_pil": image}


def url(address: str) -> dict:
    return {"type": "image_url", "image_url": {"url": address}}


def answer(llm: LLM, messages: list[dict], **options) -> tuple[list[int], list[int]]:
    output = llm.chat(messages, GREEDY, use_tqdm=False, **options)[0]
    return output.prompt_token_ids, output.outputs[0].token_ids


def test_generate_with_multi_modal_data_and_chat_with_each_image_part_agree(llm, media_dir):
    generated = llm.generate(
        {"prompt": PROMPT, "multi_modal_data": {"image": WHITE}}, GREEDY, use_tqdm=False
    )[0]
    expected = (generated.prompt_token_ids, generated.outputs[0].token_ids)
    for part in (pil(WHITE), url(data_url(png_bytes(WHITE))), url(f"file://{media_dir}/white.png")):
        assert answer(llm, ask(part)) == expected, part


def test_chat_fetches_an_http_image_as_the_server_does(llm):
    server = ImageServer()
    try:
        fetched = answer(llm, ask(url(f"{server.url}/red.png")))
    finally:
        server.close()
    assert fetched == answer(llm, ask(pil(Image.open(io.BytesIO(RED_PNG)))))


def test_a_different_image_gives_a_different_answer(llm):
    assert answer(llm, ask(pil(WHITE)))[1] != answer(llm, ask(pil(BLACK)))[1]


def test_the_string_content_format_renders_the_same_prompt_for_this_template(llm):
    # "user: <image>\nw1 w2" (string) and "user: <image> w1 w2 " (openai) tokenize alike.
    assert answer(llm, ask(pil(WHITE)), chat_template_content_format="string") == answer(
        llm, ask(pil(WHITE)), chat_template_content_format="openai"
    )


def test_generate_takes_a_list_of_images_one_per_placeholder(llm):
    prompt = f"user: {PLACEHOLDER} {PLACEHOLDER} w1 </s>assistant:"
    two = llm.generate(
        {"prompt": prompt, "multi_modal_data": {"image": [WHITE, BLACK]}}, GREEDY, use_tqdm=False
    )[0]
    chatted = answer(
        llm, [{"role": "user", "content": [pil(WHITE), pil(BLACK), {"type": "text", "text": "w1"}]}]
    )
    assert (two.prompt_token_ids, two.outputs[0].token_ids) == chatted


@pytest.mark.parametrize(
    ("part", "message"),
    [
        (url("file:///etc/passwd"), "messages[0].content[0].image_url: 'file:///etc/passwd' is "
                                    "outside --allowed-local-media-path"),
        (url("data:image/png;base64,AAAA"), "messages[0].content[0].image_url: not an image"),
        (pil(b"png"), "messages[0].content[0].image_pil must be a PIL image, not bytes"),
        ({"type": "image_embeds"}, "messages[0].content[0]: image_embeds is not supported"),
    ],
)  # fmt: skip
def test_a_bad_image_part_is_a_value_error_naming_it(llm, part, message):
    with pytest.raises(ValueError) as error:
        llm.chat(ask(part), GREEDY, use_tqdm=False)
    assert str(error.value).startswith(message)
    assert answer(llm, ask(pil(WHITE)))[1]  # and the engine goes on


def test_multi_modal_data_must_be_a_dict(llm):
    with pytest.raises(ValueError, match="^multi_modal_data must be a dict of modality"):
        llm.generate({"prompt": PROMPT, "multi_modal_data": [WHITE]}, GREEDY, use_tqdm=False)


def test_a_text_only_model_refuses_images_naming_the_field(tmp_path):
    text_only = LLM(**engine_kwargs(write_tiny_checkpoint(tmp_path)))
    with pytest.raises(ValueError, match=r"^messages\[0\]\.content\[0\]\.image_pil: this model "):
        text_only.chat(ask(pil(WHITE)), GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="^multi_modal_data: .* takes text only"):
        text_only.generate({"prompt": "w1", "multi_modal_data": {"image": WHITE}}, GREEDY)
