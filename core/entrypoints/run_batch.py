"""`core run-batch -i requests.jsonl -o results.jsonl`: an OpenAI Batch file run offline.

Each input line is OpenAI's batch request, `{"custom_id", "method": "POST", "url", "body"}`,
for any generation endpoint the server has (/v1/chat/completions, /v1/completions, and
/v1/embeddings where it is served). The requests go through the server's own app in this
process (`build_app` over AsyncLLM, called as an ASGI app with no socket), so validation,
errors and response bodies are exactly what `core serve` answers, and all requests run
concurrently so the engine batches them.

Each output line is OpenAI's batch output record, in input order:
`{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error": null}`.
A request the endpoint refuses is answered as the server would (a 4xx status and its
error body). A line that cannot be sent at all (not UTF-8, not JSON Python can read:
nested too deep or an integer past its digit limit, a lone surrogate, a missing or mistyped
field, an unsupported method or url, a duplicate custom_id, `"stream": true`) becomes an error
record, `{"response": null, "error": {"code", "message"}}`, and the batch goes on: bad
lines never stop it. Blank lines are skipped.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, BinaryIO, TextIO

import click

from core.engine_args import EngineArgs, engine_options

__all__ = ["BatchLine", "parse_batch_lines", "run_batch", "write_batch_results"]

# The endpoints OpenAI's batch API takes; a batch runs those the app serves.
BATCH_URLS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
INVALID_REQUEST = "invalid_request"

AsgiApp = Callable[..., Awaitable[None]]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchLine:
    """One input line: a request to send, or the reason it cannot be sent (`error`)."""

    line_number: int
    custom_id: str | None
    url: str | None = None
    body: dict[str, Any] | None = None
    error: str | None = None


def parse_batch_lines(lines: Iterable[str | bytes], urls: Iterable[str]) -> list[BatchLine]:
    """The requests of a batch file, blank lines skipped; `urls` are the endpoints served.
    Lines as read from a binary file are decoded one by one, so a line that is not UTF-8
    is that line's error, not the batch's."""
    served = tuple(urls)
    parsed: list[BatchLine] = []
    first_line_of: dict[str, int] = {}
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        line = _parse_line(number, text, served)
        if line.error is None and line.custom_id in first_line_of:
            earlier = first_line_of[line.custom_id]
            reason = f"line {number}: custom_id {line.custom_id!r} is used by line {earlier}"
            line = BatchLine(number, line.custom_id, error=reason)
        elif line.custom_id is not None:
            first_line_of.setdefault(line.custom_id, number)
        parsed.append(line)
    return parsed


def _parse_line(number: int, text: str | bytes, served: tuple[str, ...]) -> BatchLine:
    try:
        # ValueError covers integers past Python's digit limit; RecursionError deep nesting.
        request = json.loads(text)
    except UnicodeDecodeError as exc:
        return BatchLine(number, None, error=f"line {number} is not UTF-8: {exc}")
    except (ValueError, RecursionError) as exc:
        return BatchLine(number, None, error=f"line {number} is not JSON: {exc}")
    if not isinstance(request, dict):
        return BatchLine(number, None, error=f"line {number} is not a JSON object")
    custom_id = request.get("custom_id")
    custom_id = custom_id if isinstance(custom_id, str) and _is_unicode(custom_id) else None
    if not _is_unicode(request):
        # JSON may escape lone surrogates ("\ud800"); no record or request body could hold one.
        return BatchLine(number, custom_id, error=f"line {number} holds a lone surrogate")

    def refused(reason: str) -> BatchLine:
        return BatchLine(number, custom_id, error=f"line {number}: {reason}")

    if custom_id is None:
        return refused("custom_id must be a string")
    if request.get("method") != "POST":
        return refused(f"method must be POST, got {request.get('method')!r}")
    url = request.get("url")
    if url not in served:
        return refused(f"url {url!r} is not a batch endpoint here; use one of {list(served)}")
    body = request.get("body")
    if not isinstance(body, dict):
        return refused("body must be a JSON object")
    if body.get("stream"):
        return refused("body.stream: batch requests cannot stream")
    return BatchLine(number, custom_id, url=url, body=body)


def _is_unicode(value: Any) -> bool:
    """Whether `value` (parsed JSON) encodes as UTF-8, i.e. holds no lone surrogate."""
    try:
        json.dumps(value, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return False
    return True


async def write_batch_results(
    app: AsgiApp, lines: list[BatchLine], out: TextIO, on_done: Callable[[], None] = lambda: None
) -> dict[str, int]:
    """Send every request to `app` at once and write each line's record to `out` in input
    order, as soon as it and every line before it are done. Returns the number of records
    by kind: "succeeded" (2xx), "failed" (an HTTP error) and "invalid" (error records)."""
    tasks = [asyncio.ensure_future(_record(app, line)) for line in lines]
    for task in tasks:
        task.add_done_callback(lambda _: on_done())
    counts = {"succeeded": 0, "failed": 0, "invalid": 0}
    for task in tasks:
        record = await task
        counts[_kind(record)] += 1
        out.write(json.dumps(record, ensure_ascii=False) + "\n")
        out.flush()
    return counts


def _kind(record: dict[str, Any]) -> str:
    if record["response"] is None:
        return "invalid"
    return "succeeded" if record["response"]["status_code"] < 300 else "failed"


async def _record(app: AsgiApp, line: BatchLine) -> dict[str, Any]:
    record: dict[str, Any] = {
        "id": f"batch_req_{uuid.uuid4().hex}",
        "custom_id": line.custom_id,
        "response": None,
        "error": None,
    }
    if line.error is not None:
        record["error"] = {"code": INVALID_REQUEST, "message": line.error}
        return record
    request_id = f"batch-{uuid.uuid4().hex}"
    status, body = await _post(app, line.url or "", json.dumps(line.body).encode(), request_id)
    record["response"] = {"status_code": status, "request_id": request_id, "body": body}
    return record


async def _post(app: AsgiApp, path: str, body: bytes, request_id: str) -> tuple[int, Any]:
    """POST `body` to `app` at `path` as one ASGI HTTP request: (status, JSON answer)."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"x-request-id", request_id.encode())],
        "client": None,
        "server": None,
    }
    delivered = False
    status = 500
    chunks: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.get_running_loop().create_future()  # never set: no client leaves
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    try:
        await app(scope, receive, send)
    except Exception:  # the app answered 500 already (its handler); the batch goes on
        logger.exception("batch request %s failed", request_id)
    answer = b"".join(chunks)
    try:
        return status, json.loads(answer)
    except json.JSONDecodeError:  # no answer, or not JSON: say so in OpenAI's error shape
        message = answer.decode(errors="replace") or "internal error"
        error = {"message": message, "type": "server_error", "param": None, "code": None}
        return status, {"error": error}


def served_batch_urls(app: Any) -> list[str]:
    """The batch endpoints `app` (a FastAPI app) has a POST route for. Its routes are asked
    as a request's routing asks them: the routes of an included router (the server's) are
    not listed in `app.routes` by newer FastAPI releases."""
    from starlette.routing import Match

    def posts(url: str) -> bool:
        scope = {"type": "http", "method": "POST", "path": url, "root_path": ""}
        return any(route.matches(scope)[0] == Match.FULL for route in app.routes)

    return [url for url in BATCH_URLS if posts(url)]


async def run_batch_file(
    engine_args: EngineArgs, source: Iterable[str | bytes], out: TextIO
) -> dict[str, int]:
    """Start the engine, run every line of `source` into `out`, stop the engine."""
    from tqdm import tqdm

    from core.engine.async_llm import AsyncLLM
    from core.entrypoints.openai.api_server import build_app
    from core.entrypoints.openai.frontend_args import FrontendArgs

    engine = await AsyncLLM.start(engine_args)
    try:
        # The progress bar says how far the batch is: no periodic stats lines beside it.
        app = build_app(engine, frontend=FrontendArgs(disable_log_stats=True))
        lines = parse_batch_lines(source, served_batch_urls(app))
        with tqdm(total=len(lines), desc="Running batch", unit="req", file=sys.stderr) as bar:
            return await write_batch_results(app, lines, out, on_done=lambda: bar.update(1))
    finally:
        engine.shutdown()


@click.command("run-batch")
@click.option(
    "-i",
    "--input-file",
    "source",
    type=click.File("rb"),
    required=True,
    help="the OpenAI Batch requests, one JSON object a line, UTF-8 ('-': stdin)",
)
@click.option(
    "-o",
    "--output-file",
    "out",
    type=click.File("w", encoding="utf-8"),
    required=True,
    help="where each line's result goes, in input order ('-': stdout)",
)
@engine_options
def run_batch(source: BinaryIO, out: TextIO, **options: Any) -> None:
    """Run an OpenAI Batch file (chat, completions, embeddings) through the engine offline."""
    logging.getLogger("core").setLevel(logging.INFO)
    try:
        counts = asyncio.run(run_batch_file(EngineArgs.from_cli(options), source, out))
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(
        f"{sum(counts.values())} requests: {counts['succeeded']} succeeded, {counts['failed']} "
        f"answered with an HTTP error, {counts['invalid']} invalid lines (error records)",
        err=True,
    )
