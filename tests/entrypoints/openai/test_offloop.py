"""OffLoop: the work of a large request never holds up a small one's, and the body limit
middleware tells it which is which."""

from __future__ import annotations

import asyncio
import threading

from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from core.entrypoints.openai.middleware import BodySizeLimit
from core.entrypoints.openai.offload import LARGE_BODY_BYTES, OffLoop, request_body_bytes


def test_small_work_runs_while_a_large_requests_work_holds_its_thread():
    offload = OffLoop()
    release = threading.Event()

    async def large_request() -> str:
        request_body_bytes.set(LARGE_BODY_BYTES + 1)  # this task's own context
        return await offload.run(lambda: "large" if release.wait(30) else "timed out")

    async def run() -> None:
        large = asyncio.create_task(large_request())
        await asyncio.sleep(0.05)  # the large work now holds its thread
        assert await asyncio.wait_for(offload.run(lambda: "small"), timeout=10) == "small"
        assert not large.done()
        release.set()
        assert await large == "large"

    try:
        asyncio.run(run())
    finally:
        release.set()
        offload.shutdown()


def test_the_body_limit_notes_the_size_of_the_body_for_the_route():
    app = FastAPI()
    app.add_middleware(BodySizeLimit, max_bytes=1 << 20)

    @app.post("/echo-size")
    async def echo_size(raw: Request) -> dict[str, int]:
        await raw.body()
        return {"seen": request_body_bytes.get()}

    client = TestClient(app)
    for size in (0, 10, 300_000):
        assert client.post("/echo-size", content=b"x" * size).json() == {"seen": size}
