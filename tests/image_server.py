"""A local HTTP server of test images and of the ways a URL can fail, and image helpers.

Routes: /red.png (a 4x3 red PNG), /late.png (the same after `LATE_S`), /slow.png (after
`SLOW_S`), /trickle.png (one
byte every 0.1 s, for seconds), /big.png (a declared body over `BIG_BYTES`), /big-unsized.png
(the same, its size undeclared), /text (not an image), /redirect.png (to /red.png), /to-file (a
redirect to a file URL); anything else is a 404. `served` counts the requests of each path.
"""

from __future__ import annotations

import base64
import io
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from PIL import Image

LATE_S = 0.3  # /late.png's delay: within the limit tests set
SLOW_S = 3.0  # /slow.png's delay: far past it
BIG_BYTES = 64 * 1024  # /big*.png's bodies are over this
RED = (255, 0, 0)


def png_bytes(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


RED_PNG = png_bytes(Image.new("RGB", (4, 3), RED))


class ImageServer:
    """The server on 127.0.0.1 and a free port, serving from a thread until `close`."""

    def __init__(self) -> None:
        self.served: Counter[str] = Counter()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self.served))
        self._server.daemon_threads = True  # a trickling answer never holds the test's end
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler(served: Counter[str]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # quiet test output
            pass

        def do_GET(self) -> None:
            route = {
                "/red.png": self._red,
                "/late.png": lambda: self._delayed(LATE_S),
                "/slow.png": lambda: self._delayed(SLOW_S),
                "/trickle.png": self._trickle,
                "/big.png": self._big,
                "/big-unsized.png": self._big_unsized,
                "/text": self._text,
                "/redirect.png": lambda: self._redirect("/red.png"),
                "/to-file": lambda: self._redirect("file:///etc/passwd"),
            }.get(self.path, lambda: self.send_error(404))
            route()
            served[self.path] += 1  # after the answer: counts what was served

        def _send(self, body: bytes, content_type: str = "image/png") -> None:
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _red(self) -> None:
            self._send(RED_PNG)

        def _delayed(self, seconds: float) -> None:
            time.sleep(seconds)
            self._send(RED_PNG)

        def _trickle(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            for _ in range(100):
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(0.1)

        def _big(self) -> None:
            self._send(b"x" * (BIG_BYTES + 1))

        def _big_unsized(self) -> None:
            self.send_response(200)  # HTTP/1.0 without a length: the body ends at the close
            self.end_headers()
            self.wfile.write(b"x" * (BIG_BYTES + 1))

        def _text(self) -> None:
            self._send(b"hello, not an image", "text/plain")

        def _redirect(self, location: str) -> None:
            self.send_response(302)
            self.send_header("Location", location)
            self.send_header("Content-Length", "0")
            self.end_headers()

    return Handler
