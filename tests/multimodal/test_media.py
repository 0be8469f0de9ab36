"""MediaConnector: an image URL (data, file, http) in, an RGB PIL image out; every failure
a ValueError starting with the caller's field. HTTP against a local server (image_server)."""

from __future__ import annotations

import asyncio
import io
import re
import time

import pytest
from image_server import BIG_BYTES, RED, RED_PNG, ImageServer, data_url, png_bytes
from PIL import Image

from core.multimodal.media import MediaConnector

FIELD = "messages[0].content[1].image_url"
TIMEOUT_S = 0.5


@pytest.fixture(scope="module")
def server():
    server = ImageServer()
    yield server
    server.close()


@pytest.fixture
def connector() -> MediaConnector:
    return MediaConnector(fetch_timeout=TIMEOUT_S, max_bytes=BIG_BYTES)


def pixels(image: Image.Image) -> list[tuple[int, ...]]:
    return [image.getpixel((x, y)) for y in range(image.height) for x in range(image.width)]


def refused(connector: MediaConnector, url: str, reason: str) -> str:
    """The message of loading `url`, which must start with FIELD and hold `reason`."""
    with pytest.raises(ValueError) as error:
        connector.load_image(url, FIELD)
    message = str(error.value)
    assert message.startswith(f"{FIELD}: ") and reason in message, message
    return message


# --- data URLs and decoding ----------------------------------------------------------------


def test_a_data_url_decodes_to_its_rgb_pixels(connector):
    image = connector.load_image(data_url(RED_PNG), FIELD)
    assert (image.mode, image.size, pixels(image)) == ("RGB", (4, 3), [RED] * 12)


def test_transparency_is_composed_over_white_and_grey_becomes_rgb(connector):
    clear = Image.new("RGBA", (2, 1), (0, 0, 255, 0))
    clear.putpixel((1, 0), (0, 0, 255, 255))
    assert pixels(connector.load_image(data_url(png_bytes(clear)), FIELD)) == [
        (255, 255, 255),
        (0, 0, 255),
    ]
    grey = Image.new("L", (1, 1), 7)
    assert pixels(connector.load_image(data_url(png_bytes(grey)), FIELD)) == [(7, 7, 7)]


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("data:image/png," + RED_PNG.hex(), "data URL must be data:<type>;base64,<data>"),
        ("data:image/png;base64", "data URL must be data:<type>;base64,<data>"),
        ("data:image/png;base64,@@@@", "not base64"),
        (data_url(b"hello, not an image"), "not an image Pillow can decode"),
        (data_url(RED_PNG[: len(RED_PNG) // 2]), "not an image Pillow can decode"),  # cut
        ("ftp://example.com/a.png", "is not a data:, file: or http(s): URL"),
        ("red.png", "is not a data:, file: or http(s): URL"),
    ],
)
def test_a_bad_data_url_or_scheme_is_refused_naming_the_field(connector, url, reason):
    refused(connector, url, reason)


def test_a_data_url_over_the_byte_limit_is_refused_before_decoding(connector):
    refused(connector, data_url(b"x" * (BIG_BYTES + 3)), f"larger than {BIG_BYTES} bytes")


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
def test_a_decompression_bomb_is_refused_before_decoding(connector, monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 11)  # the 4x3 image is a bomb now
    refused(connector, data_url(RED_PNG), "more than Pillow's MAX_IMAGE_PIXELS (11)")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 5)  # past twice the limit: Pillow's error
    refused(connector, data_url(RED_PNG), "too many pixels")


def test_a_pil_image_is_taken_as_rgb_and_anything_else_refused(connector):
    image = connector.load_image(Image.new("L", (1, 1), 9), FIELD)
    assert (image.mode, pixels(image)) == ("RGB", [(9, 9, 9)])
    with pytest.raises(ValueError, match=re.escape(f"{FIELD} must be a PIL image, not bytes")):
        connector.load_image(RED_PNG, FIELD)


# --- file URLs -----------------------------------------------------------------------------


@pytest.fixture
def media_dir(tmp_path):
    """tmp/allowed/red.png, tmp/secret.png beside it, and tmp/allowed/link -> the secret."""
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "red.png").write_bytes(RED_PNG)
    (tmp_path / "secret.png").write_bytes(RED_PNG)
    (allowed / "link.png").symlink_to(tmp_path / "secret.png")
    return allowed


def test_a_file_under_the_allowed_path_is_read(media_dir):
    connector = MediaConnector(str(media_dir))
    image = connector.load_image(f"file://{media_dir}/red.png", FIELD)
    assert pixels(image) == [RED] * 12
    with_dots = f"file://{media_dir}/../allowed/red.png"  # resolved, it stays inside
    assert pixels(connector.load_image(with_dots, FIELD)) == [RED] * 12


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("../secret.png", "is outside --allowed-local-media-path"),
        ("link.png", "is outside --allowed-local-media-path"),  # a symlink out
        ("missing.png", "is not a file"),
        (".", "is not a file"),
    ],
)
def test_a_file_url_leading_out_of_the_allowed_path_is_refused(media_dir, name, reason):
    refused(MediaConnector(str(media_dir)), f"file://{media_dir}/{name}", reason)


def test_file_urls_are_refused_without_an_allowed_path(media_dir):
    refused(MediaConnector(), f"file://{media_dir}/red.png", "file URLs are not allowed")


def test_a_file_url_of_another_host_and_an_oversized_file_are_refused(media_dir):
    connector = MediaConnector(str(media_dir), max_bytes=len(RED_PNG) - 1)
    refused(connector, f"file://example.com{media_dir}/red.png", "a file URL names a local path")
    refused(connector, f"file://{media_dir}/red.png", f"larger than {len(RED_PNG) - 1} bytes")


def test_the_allowed_path_must_be_a_directory(media_dir):
    with pytest.raises(ValueError, match="^--allowed-local-media-path .*: not a directory"):
        MediaConnector(str(media_dir / "red.png"))


# --- http(s) URLs --------------------------------------------------------------------------


def test_an_http_url_gives_the_same_image_as_its_data_url(server, connector):
    fetched = connector.load_image(f"{server.url}/red.png", FIELD)
    assert pixels(fetched) == pixels(connector.load_image(data_url(RED_PNG), FIELD))
    assert pixels(connector.load_image(f"{server.url}/redirect.png", FIELD)) == [RED] * 12


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("/missing.png", "answered HTTP 404 (Not Found)"),
        ("/text", "not an image Pillow can decode"),
        ("/big.png", f"larger than {BIG_BYTES} bytes"),  # by its Content-Length
        ("/big-unsized.png", f"larger than {BIG_BYTES} bytes"),  # by what arrived
        ("/to-file", "Redirection to url 'file:///etc/passwd' is not allowed"),
    ],
)
def test_a_bad_http_answer_is_refused_naming_the_field(server, connector, path, reason):
    refused(connector, f"{server.url}{path}", reason)


@pytest.mark.parametrize("path", ["/slow.png", "/trickle.png"])
def test_a_url_that_does_not_download_in_time_is_refused_at_the_limit(server, connector, path):
    started = time.monotonic()
    refused(connector, f"{server.url}{path}", f"did not download within {TIMEOUT_S} s")
    # At most twice the limit (one socket wait may start just before it), never the
    # seconds the server would take.
    assert time.monotonic() - started < 2 * TIMEOUT_S + 0.5


def test_an_unreachable_host_is_refused_naming_the_field(connector):
    refused(connector, "http://127.0.0.1:1/red.png", "cannot be fetched")


def test_the_limits_default_to_the_environment(monkeypatch):
    monkeypatch.setenv("CORE_IMAGE_FETCH_TIMEOUT", "0.25")
    monkeypatch.setenv("CORE_MAX_MEDIA_BYTES", "1000")
    connector = MediaConnector()
    assert (connector.fetch_timeout, connector.max_bytes) == (0.25, 1000)
    monkeypatch.setenv("CORE_MAX_MEDIA_BYTES", "lots")
    with pytest.raises(ValueError, match="^CORE_MAX_MEDIA_BYTES='lots': must be a finite"):
        MediaConnector()


# --- several at once, off the event loop -------------------------------------------------


def test_images_load_concurrently_off_the_event_loop_in_order(server, connector):
    async def load_while_ticking() -> tuple[list[Image.Image], int]:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.create_task(tick())
        items = [
            (f"{server.url}/late.png", "a"),
            (data_url(png_bytes(Image.new("L", (1, 1)))), "b"),
        ]
        images = await connector.load_images(items)
        ticker.cancel()
        return images, ticks

    images, ticks = asyncio.run(load_while_ticking())
    assert [image.size for image in images] == [(4, 3), (1, 1)]
    assert ticks > 0  # the loop ran while the images loaded


def test_the_first_failure_is_raised_once_every_load_has_finished(server, connector):
    before = server.served["/late.png"]
    items = [(f"{server.url}/late.png", "first"), ("data:,", "second"), ("nope", "third")]
    with pytest.raises(ValueError, match="^second: "):
        asyncio.run(connector.load_images(items))
    assert server.served["/late.png"] == before + 1  # finished before the error came


def test_an_image_whose_data_stops_early_is_refused_when_decoded(connector):
    noise = Image.frombytes("L", (64, 64), bytes(range(256)) * 16)
    whole = png_bytes(noise)
    cut = whole[: len(whole) * 3 // 4]
    assert Image.open(io.BytesIO(cut)).size == (64, 64)  # its header reads fine
    refused(connector, data_url(cut), "not an image Pillow can decode")
