"""POST /pooling on a real `core serve --io-processor-plugin words` of the tiny model, with
the `words` plugin (tests/plugin_sources.py) installed beside core: answers equal the
server's own greedy completions of the processor's prompts, refused data is a 400 naming
`data`, and only the API server process ever imports the processor. The `picture` plugin,
whose prompt carries an image, does the same on a tiny LLaVA."""

from __future__ import annotations

import base64
import io
import os
import textwrap
import time

import httpx
import pytest
from PIL import Image
from plugin_sources import (
    PICTURE_IO_ENTRY_POINTS,
    WORDS_IO_ENTRY_POINTS,
    picture_io_processor,
    words_io_processor,
)
from server_process import ServerProcess
from tiny_engine_checkpoint import write_tiny_checkpoint

from core import LLM, SamplingParams
from core.testing.tiny_vlm import write_tiny_vlm

pytestmark = pytest.mark.slow

MODEL = "tiny-words"


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory) -> str:
    """The `words` and `picture` plugins as installed distributions, in a directory for
    PYTHONPATH."""
    root = tmp_path_factory.mktemp("site")
    install(root, "acme-words-io", WORDS_IO_ENTRY_POINTS, words_io_processor())
    install(root, "acme-picture-io", PICTURE_IO_ENTRY_POINTS, picture_io_processor())
    return str(root)


def install(root, name: str, entry_points: dict, modules: dict[str, str]) -> None:
    for relpath, source in modules.items():
        (root / relpath).parent.mkdir(parents=True, exist_ok=True)
        (root / relpath).write_text(textwrap.dedent(source))
    info = root / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    ((group, entries),) = entry_points.items()
    lines = [f"[{group}]", *(f"{entry} = {value}" for entry, value in entries.items())]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def import_log(tmp_path_factory):
    return tmp_path_factory.mktemp("imports") / "pids"


def serve(model_dir, plugin: str, plugin_site: str, env: dict[str, str]) -> ServerProcess:
    pythonpath = os.pathsep.join(filter(None, [plugin_site, os.environ.get("PYTHONPATH")]))
    return ServerProcess(
        str(model_dir), "--served-model-name", MODEL, "--dtype", "float32",
        "--max-model-len", "64", "--kv-cache-memory", "1MiB", "--io-processor-plugin", plugin,
        env={"PYTHONPATH": pythonpath, **env},
    ).wait_ready()  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory, plugin_site, import_log):
    model_dir = write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))
    process = serve(model_dir, "words", plugin_site, {"CORE_TEST_IMPORT_LOG": str(import_log)})
    yield process
    process.stop()


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


def completion(client: httpx.Client, prompt: str) -> str:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 3, "temperature": 0.0}
    response = client.post("/v1/completions", json={**body, "ignore_eos": True})
    return response.json()["choices"][0]["text"]


def test_the_answer_is_the_greedy_completion_of_each_prompt(client):
    started = int(time.time())
    body = {"model": MODEL, "data": {"words": ["w1", "w5", "w1"]}, "request_id": "mine"}
    response = client.post("/pooling", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert set(answer) == {"request_id", "created_at", "data"}
    assert answer["request_id"] == "mine" and answer["created_at"] >= started
    expected = [completion(client, word) for word in ("w1", "w5", "w1")]
    assert answer["data"] == {"answer": expected}


def test_without_a_request_id_the_server_makes_one(client):
    first, second = (client.post("/pooling", json={"data": {"words": ["w2"]}}) for _ in "ab")
    assert first.json()["request_id"].startswith("pooling-")
    assert first.json()["request_id"] != second.json()["request_id"]
    assert first.json()["data"] == second.json()["data"]


@pytest.mark.parametrize(
    ("body", "status", "param", "message"),
    [
        ({"data": {"words": []}}, 400, "data", "data must be {"),
        ({"data": "w1"}, 400, "data", "data must be {"),
        ({"data": {"words": ["w1 w2"]}}, 400, "data", "data.words must be single words"),
        ({"model": MODEL}, 400, "data", "data"),
        ({"model": "other", "data": {"words": ["w1"]}}, 404, "model", "does not exist"),
    ],
)
def test_refused_requests_are_openai_errors_and_the_engine_keeps_serving(
    client, body, status, param, message
):
    response = client.post("/pooling", json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and message in error["message"]
    assert client.post("/pooling", json={"data": {"words": ["w1"]}}).status_code == 200


def test_only_the_api_server_process_imports_the_processor(client, server, import_log):
    assert client.post("/pooling", json={"data": {"words": ["w3"]}}).status_code == 200
    engine_core = server.engine_pid()
    assert engine_core != server.proc.pid
    assert import_log.read_text().split() == [str(server.proc.pid)]


def test_a_prompt_with_an_image_is_answered_as_offline_generate_answers_it(tmp_path, plugin_site):
    model_dir = write_tiny_vlm(tmp_path, "llava-clip")
    llm = LLM(str(model_dir), dtype="float32", max_model_len=64, kv_cache_memory="1MiB")
    greedy = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    expected = [
        llm.generate({"prompt": "<image> w1 w2", "multi_modal_data": {"image": image(c)}}, greedy)[
            0
        ]
        .outputs[0]
        .text
        for c in ("white", "black")
    ]
    llm.engine.shutdown()
    server = serve(model_dir, "picture", plugin_site, {})
    try:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            answers = [
                client.post("/pooling", json={"data": {"image": png(c), "question": "w1 w2"}})
                for c in ("white", "black")
            ]
        assert [a.status_code for a in answers] == [200, 200], answers[0].text
        assert [a.json()["data"] for a in answers] == [{"answer": t} for t in expected]
        assert expected[0] != expected[1]  # the tiny LLaVA tells these images apart
    finally:
        server.stop()


def image(color: str) -> Image.Image:
    return Image.new("RGB", (28, 28), color)


def png(color: str) -> str:
    buffer = io.BytesIO()
    image(color).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")
