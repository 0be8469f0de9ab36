"""A real `core serve` of the tiny LLaVA checkpoint, driven by the openai client: an image as
a data URL and the same image from a local HTTP server give the same answer; an oversized
image, a non-image, a URL that times out, a disallowed file path and more images than
--limit-mm-per-prompt are each a 400 naming the field, and the server serves on. One server
for every check."""

from __future__ import annotations

import openai
import pytest
from image_server import RED_PNG, data_url
from server_process import ServerProcess

from core.testing.tiny_vlm import write_tiny_vlm

pytestmark = pytest.mark.slow

LIMIT = 2
MAX_BYTES = 4096  # the red PNG fits, /big.png does not
TEXT = {"type": "text", "text": "w1 w2"}


@pytest.fixture(scope="module")
def client(tmp_path_factory, media_dir):
    model_dir = write_tiny_vlm(tmp_path_factory.mktemp("llava"), "llava-clip")
    process = ServerProcess(
        str(model_dir), "--max-model-len", "128", "--dtype", "float32",
        "--limit-mm-per-prompt", f'{{"image": {LIMIT}}}',
        "--allowed-local-media-path", str(media_dir),
        env={"CORE_IMAGE_FETCH_TIMEOUT": "0.5", "CORE_MAX_MEDIA_BYTES": str(MAX_BYTES)},
    ).wait_ready()  # fmt: skip
    yield openai.OpenAI(base_url=f"{process.url}/v1", api_key="x", max_retries=0, timeout=60)
    process.stop()


def image(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def ask(client: openai.OpenAI, *parts: dict) -> str:
    messages = [{"role": "user", "content": [*parts, TEXT]}]
    out = client.chat.completions.create(
        model=client.models.list().data[0].id, messages=messages, max_tokens=4, temperature=0
    )
    return out.choices[0].message.content


def test_a_data_url_and_a_local_server_url_give_the_same_answer(client, images, media_dir):
    by_data = ask(client, image(data_url(RED_PNG)))
    assert ask(client, image(f"{images.url}/red.png")) == by_data
    assert ask(client, image(f"file://{media_dir}/red.png")) == by_data


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("{server}/big.png", f"larger than {MAX_BYTES} bytes"),
        ("{server}/text", "not an image Pillow can decode"),
        ("{server}/slow.png", "did not download within 0.5 s"),
        ("file://{media}/../secret.png", "outside --allowed-local-media-path"),
    ],
)
def test_a_bad_image_is_a_400_naming_its_field_and_the_server_serves_on(
    client, images, media_dir, url, reason
):
    bad = image(url.format(server=images.url, media=media_dir))
    with pytest.raises(openai.BadRequestError) as refused:
        ask(client, image(data_url(RED_PNG)), bad)
    error = refused.value.body
    assert error["param"] == "messages[0].content[1].image_url", error
    assert reason in error["message"], error
    assert ask(client, image(data_url(RED_PNG)))


def test_more_images_than_the_limit_are_a_400_before_any_is_fetched(client, images):
    before = images.served["/red.png"]
    with pytest.raises(openai.BadRequestError) as refused:
        ask(client, *[image(f"{images.url}/red.png")] * (LIMIT + 1))
    assert refused.value.body["param"] == f"messages[0].content[{LIMIT}].image_url"
    assert "--limit-mm-per-prompt" in refused.value.body["message"]
    assert images.served["/red.png"] == before
    assert ask(client, image(data_url(RED_PNG)))
