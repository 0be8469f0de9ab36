"""`core run-batch`: OpenAI Batch files through the server's app, in input order; bad lines
become error records and never stop the batch."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from tiny_engine_checkpoint import write_tiny_checkpoint

from core.entrypoints.cli import cli
from core.entrypoints.run_batch import parse_batch_lines, served_batch_urls, write_batch_results

URLS = ("/v1/chat/completions", "/v1/completions")


def request_line(custom_id: str, url: str = "/v1/completions", **body) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def echo_app() -> FastAPI:
    """Answers {"echo": body, "request_id": X-Request-Id}; `delay` makes a request slow,
    `status` picks the status, `boom` raises."""
    app = FastAPI()

    @app.post("/v1/completions")
    async def completions(raw: Request) -> JSONResponse:
        body = await raw.json()
        await asyncio.sleep(body.get("delay", 0))
        if body.get("boom"):
            raise RuntimeError("boom")
        answer = {"echo": body, "request_id": raw.headers.get("x-request-id")}
        return JSONResponse(answer, status_code=body.get("status", 200))

    return app


def run(app: FastAPI, text: str) -> list[dict]:
    out = io.StringIO()
    lines = parse_batch_lines(io.StringIO(text), served_batch_urls(app))
    asyncio.run(write_batch_results(app, lines, out))
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_records_come_in_input_order_even_when_later_requests_finish_first():
    text = "\n".join(request_line(f"r{i}", delay=0.02 * (5 - i)) for i in range(5))
    records = run(echo_app(), text)
    assert [r["custom_id"] for r in records] == ["r0", "r1", "r2", "r3", "r4"]
    for i, record in enumerate(records):
        response = record["response"]
        assert record["error"] is None and record["id"].startswith("batch_req_")
        assert response["status_code"] == 200
        assert response["body"]["echo"] == {"delay": 0.02 * (5 - i)}
        # The request id is the X-Request-Id the app saw.
        assert response["body"]["request_id"] == response["request_id"]


def test_each_kind_of_bad_line_is_an_error_record_naming_the_problem():
    lines = [
        "{oops",
        "[1, 2]",
        json.dumps({"method": "POST", "url": "/v1/completions", "body": {}}),
        json.dumps({"custom_id": "get", "method": "GET", "url": "/v1/completions", "body": {}}),
        request_line("img", url="/v1/images/generations"),
        json.dumps({"custom_id": "nobody", "method": "POST", "url": "/v1/completions"}),
        request_line("stream", stream=True),
        request_line("ok"),
        request_line("ok"),
    ]
    records = run(echo_app(), "\n".join(lines))
    errors = [(r["custom_id"], r["error"]["message"]) for r in records if r["error"]]
    assert [r["response"] is None for r in records] == [True] * 7 + [False, True]
    assert all(r["error"]["code"] == "invalid_request" for r in records if r["error"])
    expected = [
        (None, "line 1 is not JSON"),
        (None, "line 2 is not a JSON object"),
        (None, "line 3: custom_id must be a string"),
        ("get", "line 4: method must be POST, got 'GET'"),
        ("img", "line 5: url '/v1/images/generations' is not a batch endpoint here"),
        ("nobody", "line 6: body must be a JSON object"),
        ("stream", "line 7: body.stream: batch requests cannot stream"),
        ("ok", "line 9: custom_id 'ok' is used by line 8"),
    ]
    assert len(errors) == len(expected)
    for (custom_id, message), (want_id, want) in zip(errors, expected, strict=True):
        assert custom_id == want_id and message.startswith(want), message


def test_lines_python_cannot_read_are_error_records_and_the_batch_goes_on():
    """Each line of a binary file is read on its own: invalid UTF-8, nesting past the
    recursion limit, an integer past the digit limit, lone surrogates."""
    lines = [
        request_line("a").encode(),
        b'{"custom_id": "utf8", "body": "\xff\xfe"}',
        ('{"custom_id": "deep", "body": ' + "[" * 100_000 + "]" * 100_000 + "}").encode(),
        request_line("digits", max_tokens=1).replace("1}", "9" * 5000 + "}").encode(),
        # json.dumps writes lone surrogates as \ud800 escapes, which json.loads reads back.
        request_line("\ud800", prompt="x").encode(),
        request_line("surrogate-in-body", prompt="\ud800").encode(),
        request_line("b").encode(),
    ]
    out = io.StringIO()
    app = echo_app()
    asyncio.run(write_batch_results(app, parse_batch_lines(lines, served_batch_urls(app)), out))
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["response"] is None for r in records] == [False, True, True, True, True, True, False]
    messages = [r["error"]["message"] for r in records[1:-1]]
    assert messages[0].startswith("line 2 is not UTF-8")
    assert messages[1].startswith("line 3 is not JSON") and "recursion" in messages[1]
    assert messages[2].startswith("line 4 is not JSON") and "digits" in messages[2]
    assert messages[3:] == ["line 5 holds a lone surrogate", "line 6 holds a lone surrogate"]
    assert [r["custom_id"] for r in records] == [
        "a",
        None,
        None,
        None,
        None,
        "surrogate-in-body",
        "b",
    ]


def test_http_errors_are_answered_as_the_server_answered_them():
    text = "\n".join(
        [request_line("refused", status=400), "", request_line("crash", boom=True)]
    )  # the blank line is skipped
    refused, crashed = run(echo_app(), text)
    assert refused["error"] is None and refused["response"]["status_code"] == 400
    assert crashed["response"]["status_code"] == 500  # the app raised: the batch goes on
    assert crashed["response"]["body"]["error"]["type"] == "server_error"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))


def run_batch_cli(source: Path, results: Path, model_dir: Path, *flags: str) -> Result:
    """`core run-batch` of `source` into `results` over the tiny model."""
    args = ["run-batch", "-i", str(source), "-o", str(results), "--model", str(model_dir)]
    args += ["--max-model-len", "64", "--kv-cache-memory", "8MiB", *flags]
    return CliRunner().invoke(cli, args, catch_exceptions=False)


def test_fifty_lines_with_four_malformed_give_46_results_and_4_error_records(model_dir, tmp_path):
    lines = []
    for i in range(50):
        if i % 2:
            body = {"messages": [{"role": "user", "content": f"w{i % 40}"}], "max_tokens": 3}
            lines.append(request_line(f"req-{i}", "/v1/chat/completions", **body))
        else:
            lines.append(request_line(f"req-{i}", prompt=f"w{i % 40} w1", max_tokens=3))
    malformed = {
        7: '{"custom_id": "req-7", "method": "POST"',  # cut short: not JSON
        20: request_line("req-20", url="/v2/x"),
        33: json.dumps({"custom_id": "req-33", "method": "POST", "url": "/v1/completions"}),
        45: "\udcff",  # written below as the byte 0xff: not UTF-8
    }
    for i, line in malformed.items():
        lines[i] = line
    source, results = tmp_path / "requests.jsonl", tmp_path / "results.jsonl"
    source.write_bytes(("\n".join(lines) + "\n").encode(errors="surrogateescape"))
    result = run_batch_cli(source, results, model_dir, "--dtype", "float32")
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in results.read_text().splitlines()]
    assert len(records) == 50
    ids = [None if i in (7, 45) else f"req-{i}" for i in range(50)]  # not JSON, not UTF-8
    assert [r["custom_id"] for r in records] == ids
    errors = [i for i, r in enumerate(records) if r["error"] is not None]
    assert errors == sorted(malformed)
    answered = [r for r in records if r["error"] is None]
    assert len(answered) == 46
    for record in answered:
        response = record["response"]
        assert response["status_code"] == 200, response
        kind = "chat.completion" if int(record["custom_id"][4:]) % 2 else "text_completion"
        assert response["body"]["object"] == kind
        assert response["body"]["usage"]["completion_tokens"] <= 3
    assert "50 requests: 46 succeeded, 0 answered with an HTTP error, 4 invalid" in result.output


def test_embedding_requests_run_in_a_batch_on_a_pooling_model(model_dir, tmp_path):
    source, results = tmp_path / "requests.jsonl", tmp_path / "results.jsonl"
    lines = [
        request_line("one", "/v1/embeddings", input="w1 w2"),
        request_line("two", "/v1/embeddings", input=["w3", "w4 w5"], dimensions=8),
    ]
    source.write_text("\n".join(lines))
    result = run_batch_cli(source, results, model_dir, "--runner", "pooling")
    assert result.exit_code == 0, result.output
    one, two = (json.loads(line) for line in results.read_text().splitlines())
    assert [one["custom_id"], two["custom_id"]] == ["one", "two"]
    assert len(one["response"]["body"]["data"]) == 1
    vectors = [item["embedding"] for item in two["response"]["body"]["data"]]
    assert [len(v) for v in vectors] == [8, 8]
