"""Media of a request: an image reference in, a decoded RGB image out (vLLM's MediaConnector).

A reference is a URL or, offline, an image already decoded (a PIL image). URLs are
- `data:<type>;base64,<data>`: decoded in place;
- `file://<path>`: only under --allowed-local-media-path, with symlinks and `..` resolved
  first, and refused when it is unset, so a request cannot read the server's files;
- `http(s)://`: fetched with a time limit (CORE_IMAGE_FETCH_TIMEOUT) and a byte limit
  (CORE_MAX_MEDIA_BYTES), so a slow or huge answer cannot hold a request. Only http(s)
  handlers run: no proxy from the environment, no redirect to another scheme.
Every image is decoded here with Pillow, whole, so a truncated file fails with its field
rather than inside the model's processor; more pixels than Pillow's MAX_IMAGE_PIXELS (a
decompression bomb) are refused before decoding. Images are made RGB, transparency over
white, as Hugging Face's processors expect.

Every failure is a ValueError whose message starts with the field the caller names (say
`messages[0].content[1].image_url`), which the server makes the 400's `param`.
Pillow is imported only when an image is loaded: `pip install 'core[vision]'`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import http.client
import io
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from core import envs

if TYPE_CHECKING:
    from PIL.Image import Image

__all__ = ["MediaConnector", "allowed_media_root"]

# Bytes asked of the socket per read of an http(s) download.
_CHUNK = 64 * 1024


class MediaConnector:
    """Loads the images a request names (see the module docstring).

    `allowed_local_media_path`: the directory file URLs may read (None: no file URLs);
    ValueError naming --allowed-local-media-path when it is not a directory. The limits
    default to CORE_IMAGE_FETCH_TIMEOUT and CORE_MAX_MEDIA_BYTES.
    """

    def __init__(
        self,
        allowed_local_media_path: str | None = None,
        *,
        fetch_timeout: float | None = None,
        max_bytes: int | None = None,
    ) -> None:
        self.allowed_root = allowed_media_root(allowed_local_media_path)
        self.fetch_timeout = envs.image_fetch_timeout() if fetch_timeout is None else fetch_timeout
        self.max_bytes = envs.max_media_bytes() if max_bytes is None else max_bytes

    def load_image(self, source: str | Image, field: str) -> Image:
        """The RGB image `source` (a URL, or a PIL image) refers to. Blocking: it may
        download, and decodes."""
        if not isinstance(source, str):
            return _rgb_image(source, field)
        return _decode(self._read(source, field), field)

    async def load_images(self, items: Sequence[tuple[str | Image, str]]) -> list[Image]:
        """`load_image` of every (source, field), each on a worker thread and all at once,
        in the items' order. When some fail, the first failure (in the items' order) is
        raised once all have finished, so no download outlives the request."""
        loads = (asyncio.to_thread(self.load_image, source, field) for source, field in items)
        results = await asyncio.gather(*loads, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return results  # type: ignore[return-value]  # no exception among them

    def _read(self, url: str, field: str) -> bytes:
        scheme = url.partition(":")[0].lower()
        if scheme == "data":
            return self._read_data_url(url, field)
        if scheme == "file":
            return self._read_file(url, field)
        if scheme in ("http", "https"):
            return self._fetch(url, field)
        raise ValueError(f"{field}: {_shown(url)} is not a data:, file: or http(s): URL")

    def _read_data_url(self, url: str, field: str) -> bytes:
        header, comma, payload = url[len("data:") :].partition(",")
        if not comma or "base64" not in header.lower().split(";")[1:]:
            raise ValueError(f"{field}: a data URL must be data:<type>;base64,<data>")
        if len(payload) // 4 * 3 > self.max_bytes:  # decoded size, before decoding
            raise self._too_large(field)
        try:
            return base64.b64decode(payload, validate=True)
        except binascii.Error as exc:
            raise ValueError(f"{field}: the data URL's data is not base64 ({exc})") from exc

    def _read_file(self, url: str, field: str) -> bytes:
        if self.allowed_root is None:
            raise ValueError(
                f"{field}: file URLs are not allowed (the server allows them under "
                "--allowed-local-media-path)"
            )
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"{field}: a file URL names a local path: file:///path")
        path = Path(urllib.request.url2pathname(parts.path)).resolve()
        # Resolved first, so neither `..` nor a symlink leads out of the directory.
        if not path.is_relative_to(self.allowed_root):
            raise ValueError(f"{field}: {_shown(url)} is outside --allowed-local-media-path")
        if not path.is_file():
            raise ValueError(f"{field}: {_shown(url)} is not a file")
        try:
            with path.open("rb") as file:
                data = file.read(self.max_bytes + 1)
        except OSError as exc:
            raise ValueError(f"{field}: {_shown(url)} cannot be read: {exc.strerror}") from exc
        if len(data) > self.max_bytes:
            raise self._too_large(field)
        return data

    def _fetch(self, url: str, field: str) -> bytes:
        """The body at an http(s) URL, within the time and byte limits. Each socket wait
        is bounded by the limit and the download stops once it has passed, so a URL holds
        a request at most twice the limit."""
        deadline = time.monotonic() + self.fetch_timeout
        try:
            with _OPENER.open(url, timeout=self.fetch_timeout) as response:
                declared = response.headers.get("Content-Length", "")
                if declared.isdigit() and int(declared) > self.max_bytes:
                    raise self._too_large(field)
                return self._read_response(response, deadline, field)
        except urllib.error.HTTPError as exc:
            reason = f"HTTP {exc.code} ({exc.reason})"
            raise ValueError(f"{field}: {_shown(url)} answered {reason}") from exc
        except TimeoutError as exc:
            raise self._timed_out(url, field) from exc
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, TimeoutError):
                raise self._timed_out(url, field) from exc
            raise ValueError(f"{field}: {_shown(url)} cannot be fetched: {reason}") from exc

    def _read_response(self, response: Any, deadline: float, field: str) -> bytes:
        chunks, size = [], 0
        # read1: one socket read at a time, so a server sending a byte now and then is
        # stopped at the deadline instead of holding one read that never fills.
        while chunk := response.read1(_CHUNK):
            size += len(chunk)
            if size > self.max_bytes:
                raise self._too_large(field)
            if time.monotonic() > deadline:
                raise TimeoutError
            chunks.append(chunk)
        return b"".join(chunks)

    def _too_large(self, field: str) -> ValueError:
        return ValueError(
            f"{field}: the image is larger than {self.max_bytes} bytes (CORE_MAX_MEDIA_BYTES)"
        )

    def _timed_out(self, url: str, field: str) -> ValueError:
        return ValueError(
            f"{field}: {_shown(url)} did not download within {self.fetch_timeout} s "
            "(CORE_IMAGE_FETCH_TIMEOUT)"
        )


def _rgb_image(image: Any, field: str) -> Image:
    """`image` (a PIL image) as RGB: transparency composed over white, as Hugging Face's
    `convert_rgb` does; ValueError naming `field` for anything else."""
    pil = _pillow()
    if not isinstance(image, pil.Image):
        raise ValueError(f"{field} must be a PIL image, not {type(image).__name__}")
    if image.mode == "RGB":
        return image
    if not image.has_transparency_data:
        return image.convert("RGB")
    white = pil.new("RGBA", image.size, (255, 255, 255, 255))
    return pil.alpha_composite(white, image.convert("RGBA")).convert("RGB")


def _decode(data: bytes, field: str) -> Image:
    pil = _pillow()
    try:
        image = pil.open(io.BytesIO(data))
    except pil.DecompressionBombError as exc:
        raise ValueError(f"{field}: the image has too many pixels ({exc})") from exc
    except (OSError, SyntaxError, ValueError) as exc:  # what Pillow raises for bad data
        raise ValueError(f"{field}: not an image Pillow can decode ({exc})") from exc
    limit = pil.MAX_IMAGE_PIXELS
    if limit is not None and image.width * image.height > limit:
        raise ValueError(
            f"{field}: the image is {image.width}x{image.height} pixels, more than Pillow's "
            f"MAX_IMAGE_PIXELS ({limit})"
        )
    try:
        image.load()  # the whole image now: a truncated file fails here, with its field
    except (OSError, SyntaxError, ValueError) as exc:
        raise ValueError(f"{field}: not an image Pillow can decode ({exc})") from exc
    return _rgb_image(image, field)


def _pillow() -> Any:
    try:
        from PIL import Image
    except ImportError as exc:
        raise ImportError("images need Pillow: pip install 'core[vision]'") from exc
    return Image


def allowed_media_root(path: str | None) -> Path | None:
    """--allowed-local-media-path resolved (None: no local files); ValueError naming the
    flag when it is not a directory. Checked when the engine is set up, so a typo fails
    the start, not the first request."""
    if path is None:
        return None
    root = Path(path).expanduser().resolve()
    if not root.is_dir():
        raise ValueError(f"--allowed-local-media-path {path}: not a directory")
    return root


def _shown(url: str) -> str:
    """A URL as an error message quotes it: a data URL's payload would be megabytes."""
    return repr(url if len(url) <= 200 else url[:200] + "...")


def _opener() -> urllib.request.OpenerDirector:
    """urllib with http(s) only: build_opener would add the environment's proxies and the
    file:, ftp: and data: handlers, which a redirect could then reach."""
    opener = urllib.request.OpenerDirector()
    for handler in (
        urllib.request.HTTPHandler(),
        urllib.request.HTTPSHandler(),
        urllib.request.HTTPRedirectHandler(),
        urllib.request.HTTPDefaultErrorHandler(),
        urllib.request.HTTPErrorProcessor(),
    ):
        opener.add_handler(handler)
    return opener


_OPENER = _opener()
