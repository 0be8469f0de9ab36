"""Images in chat requests, through the server's frontend: parts checked and counted, images
loaded (data, file and local-server URLs), rendered in either content format and expanded
by the model's processor before the engine sees them; every bad image a 400 naming its
field, the server serving on. Over a real InputProcessor of the tiny checkpoint given a
stand-in image processor, and a stand-in engine that records what reaches it and answers a
word picked by the images' identifiers (so equal images give equal answers)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from image_server import RED_PNG, data_url, png_bytes
from PIL import Image
from stand_in_engine import StandInEngine
from stand_in_image_processor import NUM_EMBEDS, PLACEHOLDER, StandInImageProcessor
from tiny_engine_checkpoint import VOCAB, write_tiny_checkpoint

from core.config import UsageContext
from core.engine.processor import EngineSetup, InputProcessor
from core.engine_args import EngineArgs
from core.entrypoints.openai.api_server import build_app
from core.entrypoints.openai.frontend_args import FrontendArgs
from core.multimodal.inputs import PlaceholderRange
from core.outputs import CompletionOutput, RequestOutput

CHAT, TOKENIZE = "/v1/chat/completions", "/tokenize"
LIMIT = 2  # --limit-mm-per-prompt {"image": 2}
MAX_BYTES = 4096  # CORE_MAX_MEDIA_BYTES: the red PNG fits
# A template that writes an image's placeholder itself (auto: the "openai" format).
LOOPING = (
    "{% for m in messages %}{{ m['role'] }}:{% for p in m['content'] %}"
    "{% if p['type'] == 'image' %} " + PLACEHOLDER + "{% else %} {{ p['text'] }}{% endif %}"
    "{% endfor %}{{ eos_token }}{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)


class ImageEngine(StandInEngine):
    """Records each prepared request; answers one word picked by its images' identifiers."""

    def __init__(self, processor: InputProcessor) -> None:
        super().__init__(processor)
        self.prepared: list = []

    async def generate(self, request_id, prepared, priority=0, lora_request=None, cache_salt=None):
        self.prepared.append(prepared)
        seed = sum(int(f.identifier, 16) for f in prepared.mm_features)
        word = f"w{seed % 40}"
        sample = CompletionOutput(0, word, [VOCAB[word]], None, None, finish_reason="length")
        yield RequestOutput(request_id, prepared.prompt, prepared.prompt_token_ids, None,
                            [sample], finished=True)  # fmt: skip


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))


def serve(model_dir: Path, media_dir: Path, takes_images: bool, **frontend) -> Served:
    args = EngineArgs(
        model=str(model_dir),
        max_model_len=64,
        limit_mm_per_prompt={"image": LIMIT},
        allowed_local_media_path=str(media_dir),
    )
    processor = InputProcessor(EngineSetup.from_engine_args(args, UsageContext.SERVING))
    if takes_images:
        processor.mm_processor = StandInImageProcessor()  # in place of the cached property
    engine = ImageEngine(processor)
    with pytest.MonkeyPatch.context() as env:  # the limits are read when the app is built
        env.setenv("CORE_IMAGE_FETCH_TIMEOUT", "0.5")
        env.setenv("CORE_MAX_MEDIA_BYTES", str(MAX_BYTES))
        settings = FrontendArgs(
            disable_log_stats=True, trust_request_chat_template=True, **frontend
        )
        app = build_app(engine, frontend=settings)
    return Served(engine, TestClient(app, raise_server_exceptions=False))


@dataclass
class Served:
    engine: ImageEngine
    client: TestClient

    def post(self, route: str, body: dict) -> httpx.Response:
        return self.client.post(route, json=body)

    def refused(self, body: dict, param: str, reason: str, route: str = CHAT) -> None:
        """`body` is a 400 naming `param`, nothing reaches the engine, and the next request
        is served."""
        before = len(self.engine.prepared)
        response = self.post(route, body)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == param and reason in error["message"], error
        assert len(self.engine.prepared) == before
        assert self.post(CHAT, chat(TEXT)).status_code == 200


@pytest.fixture(scope="module")
def served(model_dir, media_dir) -> Served:
    return serve(model_dir, media_dir, takes_images=True)


def ids(*tokens: str) -> list[int]:
    return [VOCAB[token] for token in tokens]


def image(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def chat(*parts: dict, **fields) -> dict:
    return {"messages": [{"role": "user", "content": list(parts)}], "max_tokens": 1, **fields}


TEXT = {"type": "text", "text": "w1 w2"}
FIELD = "messages[0].content[0].image_url"
# "user: w44\nw1 w2</s>assistant:" with the placeholder expanded to the image's positions
EXPANDED = ids("user", ":", *[PLACEHOLDER] * NUM_EMBEDS, "w1", "w2", "</s>", "assistant", ":")


# --- images that load ----------------------------------------------------------------------


def test_a_data_url_a_server_url_and_a_file_give_the_same_request_and_answer(
    served, images, media_dir
):
    urls = [data_url(RED_PNG), f"{images.url}/red.png", f"file://{media_dir}/red.png"]
    answers = []
    for url in urls:
        response = served.post(CHAT, chat(image(url), TEXT))
        assert response.status_code == 200, response.text
        answers.append(response.json()["choices"][0]["message"]["content"])
    first, *others = served.engine.prepared[-3:]
    assert first.prompt_token_ids == EXPANDED
    assert [f.placeholder for f in first.mm_features] == [PlaceholderRange(2, NUM_EMBEDS)]
    for other in others:
        assert other.prompt_token_ids == first.prompt_token_ids
        assert [f.identifier for f in other.mm_features] == [first.mm_features[0].identifier]
    assert answers == [answers[0]] * 3
    blue = data_url(png_bytes(Image.new("RGB", (4, 3), (0, 0, 255))))
    assert served.post(CHAT, chat(image(blue), TEXT)).status_code == 200
    assert served.engine.prepared[-1].mm_features[0].identifier != first.mm_features[0].identifier


def test_the_openai_format_lets_a_template_place_the_images_itself(served):
    response = served.post(CHAT, chat(image(data_url(RED_PNG)), TEXT, chat_template=LOOPING))
    assert response.status_code == 200, response.text
    assert served.engine.prepared[-1].prompt_token_ids == EXPANDED  # " w44 w1 w2", expanded


def test_images_keep_their_order_across_messages(served, images):
    blue = data_url(png_bytes(Image.new("RGB", (1, 1), (0, 0, 255))))
    body = {
        "messages": [
            {"role": "user", "content": [image(blue)]},
            {"role": "assistant", "content": "w3"},
            {"role": "user", "content": [image(f"{images.url}/red.png"), TEXT]},
        ],
        "max_tokens": 1,
    }
    assert served.post(CHAT, body).status_code == 200
    features = served.engine.prepared[-1].mm_features
    sizes = [tuple(f.data["pixels"].shape) for f in features]
    assert sizes == [(1, 1, 3), (3, 4, 3)]
    assert features[0].placeholder.offset < features[1].placeholder.offset


def test_tokenize_counts_each_image_as_the_positions_it_takes(served):
    body = {"messages": chat(image(data_url(RED_PNG)), TEXT)["messages"]}
    body["add_generation_prompt"] = True
    response = served.post(TOKENIZE, body)
    assert response.status_code == 200, response.text
    assert response.json()["tokens"] == EXPANDED
    assert response.json()["count"] == len(EXPANDED)


# --- images that do not ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("/big.png", f"larger than {MAX_BYTES} bytes (CORE_MAX_MEDIA_BYTES)"),
        ("/text", "not an image Pillow can decode"),
        ("/slow.png", "did not download within 0.5 s (CORE_IMAGE_FETCH_TIMEOUT)"),
        ("/missing.png", "answered HTTP 404"),
    ],
)
def test_a_bad_server_url_is_a_400_naming_its_field(served, images, path, reason):
    served.refused(chat(TEXT, image(f"{images.url}{path}")), "messages[0].content[1].image_url",
                   reason)  # fmt: skip


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("file://{media}/../secret.png", "is outside --allowed-local-media-path"),
        ("file:///etc/passwd", "is outside --allowed-local-media-path"),
        ("data:image/png;base64,@@", "not base64"),
        ("gopher://x/y.png", "is not a data:, file: or http(s): URL"),
    ],
)
def test_a_disallowed_file_or_a_bad_url_is_a_400_naming_its_field(served, media_dir, url, reason):
    served.refused(chat(image(url.format(media=media_dir))), FIELD, reason)


def test_more_images_than_the_limit_are_refused_before_any_is_fetched(served, images):
    before = images.served["/red.png"]
    parts = [image(f"{images.url}/red.png")] * (LIMIT + 1)
    served.refused(chat(*parts), f"messages[0].content[{LIMIT}].image_url",
                   f"{LIMIT + 1} images, more than the {LIMIT} a prompt may have")  # fmt: skip
    assert images.served["/red.png"] == before


@pytest.mark.parametrize(
    ("part", "reason"),
    [
        ({"type": "image_embeds", "image_embeds": "AAAA"}, "image_embeds is not supported"),
        ({"type": "input_audio", "input_audio": {}}, "'input_audio' is not supported"),
        ({"type": "image_url", "image_url": {"url": 7}}, "Input should be a valid string"),
    ],
)
def test_a_part_the_server_does_not_take_is_a_400_naming_it(served, part, reason):
    param = "messages[0].content[0]" + (".image_url.url" if part["type"] == "image_url" else "")
    served.refused(chat(part), param, reason)


def test_a_streaming_request_with_a_bad_image_is_refused_before_its_stream(served, images):
    body = chat(image(f"{images.url}/text"), stream=True)
    served.refused(body, FIELD, "not an image Pillow can decode")


def test_tokenize_refuses_a_bad_image_as_chat_does(served):
    body = {"messages": chat(image("data:,"))["messages"]}
    served.refused(body, FIELD, "data URL must be", route=TOKENIZE)


def test_the_content_format_flag_decides_over_the_template(model_dir, media_dir):
    # Reads the first part's text: only right when the template gets the parts.
    first_text = "{% for m in messages %}{{ m['content'][0]['text'] }}{% endfor %}"
    forced = serve(model_dir, media_dir, True, chat_template_content_format="openai")
    response = forced.post(CHAT, chat(TEXT, chat_template=first_text))
    assert response.status_code == 200, response.text
    assert forced.engine.prepared[-1].prompt_token_ids == ids("w1", "w2")


def test_a_text_only_model_refuses_images_without_fetching_them(model_dir, media_dir, images):
    text_only = serve(model_dir, media_dir, takes_images=False)
    before = images.served["/red.png"]
    text_only.refused(chat(TEXT, image(f"{images.url}/red.png")),
                      "messages[0].content[1].image_url", "this model takes text only")  # fmt: skip
    assert images.served["/red.png"] == before
