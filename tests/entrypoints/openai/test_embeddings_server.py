"""POST /v1/embeddings on a real `core serve` of a tiny BERT embedder, driven by the official
openai client (one shared server)."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import openai
import pytest
import torch
from server_process import ServerProcess
from tiny_embedders import write_bert_embedder

MODEL = "tiny-bert"
TEXTS = ["w1 w2 w3", "w4 w5", "w1 w2 w3", "w6 w7 w8 w9 w10"]


@pytest.fixture(scope="module")
def reference_and_server(tmp_path_factory):
    directory = tmp_path_factory.mktemp("bert")
    st_model = write_bert_embedder(directory, "mean", normalize=True)
    server = ServerProcess(
        str(directory), "--served-model-name", MODEL, "--dtype", "float32",
        "--max-model-len", "64", "--kv-cache-memory", "1MiB",
        # The installed metadata names BertModel; a core.egg-info left in the checkout by an
        # old build must not shadow it from the working directory.
        env={"PYTHONSAFEPATH": "1"},
    ).wait_ready()  # fmt: skip
    yield st_model, server
    server.stop()


@pytest.fixture(scope="module")
def server(reference_and_server) -> ServerProcess:
    return reference_and_server[1]


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def vectors(response) -> torch.Tensor:
    return torch.tensor([item.embedding for item in response.data])


def test_embeddings_match_sentence_transformers_in_input_order(client, reference_and_server):
    st_model = reference_and_server[0]
    response = client.embeddings.create(model=MODEL, input=TEXTS)  # the client asks base64
    assert [item.index for item in response.data] == [0, 1, 2, 3]
    expected = st_model.encode(TEXTS, convert_to_tensor=True).float()
    torch.testing.assert_close(vectors(response), expected, rtol=0, atol=2e-6)
    assert vectors(response)[0].dot(vectors(response)[2]).item() == pytest.approx(1, abs=1e-6)


def test_base64_decodes_to_the_same_floats(server):
    def post(encoding_format: str) -> list | str:
        # One input alone: the same forward both times, so the very same vector.
        body = {"model": MODEL, "input": TEXTS[3], "encoding_format": encoding_format}
        return httpx.post(f"{server.url}/v1/embeddings", json=body).json()["data"][0]["embedding"]

    decoded = np.frombuffer(base64.b64decode(post("base64")), dtype="<f4").tolist()
    assert decoded == post("float")


def test_token_ids_and_lists_of_them_embed_like_text(client, server):
    ids = httpx.post(f"{server.url}/tokenize", json={"prompt": TEXTS[1]}).json()["tokens"]
    text = vectors(client.embeddings.create(model=MODEL, input=TEXTS[1]))
    torch.testing.assert_close(vectors(client.embeddings.create(model=MODEL, input=ids)), text)
    both = client.embeddings.create(model=MODEL, input=[ids, ids])
    torch.testing.assert_close(vectors(both), text.repeat(2, 1))


def test_usage_counts_every_input_token(client, server):
    response = client.embeddings.create(model=MODEL, input=TEXTS[:2])
    counts = [
        httpx.post(f"{server.url}/tokenize", json={"prompt": text}).json()["count"]
        for text in TEXTS[:2]
    ]
    assert response.usage.prompt_tokens == response.usage.total_tokens == sum(counts)
    assert response.model == MODEL


def test_dimensions_return_shorter_unit_vectors(client):
    response = client.embeddings.create(model=MODEL, input=TEXTS[0], dimensions=8)
    (vector,) = vectors(response)
    assert len(vector) == 8 and vector.norm().item() == pytest.approx(1, abs=1e-6)


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"input": []}, "input", "input must not be empty"),
        ({"input": ""}, "input", "input: The decoder prompt cannot be empty"),
        ({"input": "w1", "dimensions": 33}, "dimensions", "embedding size 32"),
        ({"input": "w1", "dimensions": 0}, "dimensions", "dimensions must be an integer >= 1"),
        ({"input": [[3, 10_000]]}, "input", "input: Token id 10000 is out of vocabulary"),
        ({"input": "w1", "encoding_format": "int8"}, "encoding_format", ""),
    ],
)
def test_bad_requests_are_400s_naming_the_field(server, body, param, message):
    response = httpx.post(f"{server.url}/v1/embeddings", json={"model": MODEL, **body})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param and message in error["message"]


def test_generation_on_an_embedding_model_is_a_400(client):
    with pytest.raises(openai.BadRequestError, match="--runner pooling: it embeds"):
        client.completions.create(model=MODEL, prompt="w1", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="--runner pooling: it embeds"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "w"}])
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="other", input="w1")


def test_a_client_that_leaves_takes_its_queued_inputs_with_it(server):
    """3,000 inputs, and the client gives up before they are done: the engine aborts what
    is left of them (the next request does not queue behind them)."""
    import time

    from prometheus_client.parser import text_string_to_metric_families

    def finished(reason: str) -> float:
        text = httpx.get(f"{server.url}/metrics").text
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "vllm:request_success_total"
            and sample.labels["finished_reason"] == reason
        )

    aborted_before = finished("abort")
    body = {"model": MODEL, "input": [f"w{i % 50} w{i % 7}" for i in range(3000)]}
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{server.url}/v1/embeddings", json=body, timeout=0.5)
    deadline = time.monotonic() + 30
    while finished("abort") == aborted_before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert finished("abort") - aborted_before > 0
    one = {"model": MODEL, "input": "w1"}
    assert httpx.post(f"{server.url}/v1/embeddings", json=one, timeout=30).is_success
