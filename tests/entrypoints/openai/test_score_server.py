"""/score, /rerank, /classify and plain /pooling on a real `core serve` of a tiny BERT
cross-encoder (one label), driven with httpx against vLLM's response shapes (one shared
server); scores equal transformers' within 1e-4. A generating model asked to score is a
400 naming the task (the shared server of the default model)."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest
import torch
import transformers
from server_process import ServerProcess
from tiny_cross_encoders import write_bert_classifier

MODEL = "tiny-reranker"
QUERY = "w1 w2 w3"
DOCUMENTS = ["w4 w5", "w1 w2", "w6 w7 w8 w9", "w3"]


@pytest.fixture(scope="module")
def reference_and_server(tmp_path_factory):
    directory = tmp_path_factory.mktemp("reranker")
    model = write_bert_classifier(directory, num_labels=1, seed=7)
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    server = ServerProcess(
        str(directory), "--served-model-name", MODEL, "--dtype", "float32",
        "--max-model-len", "64", "--kv-cache-memory", "1MiB",
        env={"PYTHONSAFEPATH": "1"},  # a stale core.egg-info in the checkout must not shadow
    ).wait_ready()  # fmt: skip
    yield (model, tokenizer), server
    server.stop()


@pytest.fixture(scope="module")
def server(reference_and_server) -> ServerProcess:
    return reference_and_server[1]


@pytest.fixture(scope="module")
def reference(reference_and_server):
    model, tokenizer = reference_and_server[0]

    def logit(text: str, text_pair: str | None = None) -> float:
        with torch.no_grad():
            return model(**tokenizer(text, text_pair, return_tensors="pt")).logits[0, 0].item()

    return logit


def post(server: ServerProcess, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json={"model": MODEL, **body}, timeout=60)


def sigmoid(x: float) -> float:
    return 1 / (1 + np.exp(-x))


@pytest.mark.parametrize("path", ["/score", "/v1/score"])
def test_score_answers_vllms_shape_with_the_sigmoid_of_each_pairs_logit(server, reference, path):
    response = post(server, path, {"text_1": QUERY, "text_2": DOCUMENTS})
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list" and body["model"] == MODEL
    assert body["id"].startswith("score-") and isinstance(body["created"], int)
    assert [(d["index"], d["object"]) for d in body["data"]] == [(i, "score") for i in range(4)]
    expected = [sigmoid(reference(QUERY, d)) for d in DOCUMENTS]
    assert [d["score"] for d in body["data"]] == pytest.approx(expected, abs=1e-4)
    usage = body["usage"]
    assert usage["prompt_tokens"] == usage["total_tokens"] > 0
    many = post(server, path, {"text_1": ["w9", QUERY], "text_2": DOCUMENTS[:2]}).json()
    expected = [sigmoid(reference("w9", DOCUMENTS[0])), sigmoid(reference(QUERY, DOCUMENTS[1]))]
    assert [d["score"] for d in many["data"]] == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/v2/rerank"])
def test_rerank_returns_the_documents_best_first(server, reference, path):
    response = post(server, path, {"query": QUERY, "documents": DOCUMENTS})
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"id", "model", "usage", "results"} and body["model"] == MODEL
    expected = [sigmoid(reference(QUERY, d)) for d in DOCUMENTS]
    order = sorted(range(4), key=lambda i: -expected[i])
    results = body["results"]
    assert [r["index"] for r in results] == order
    assert [r["document"] for r in results] == [{"text": DOCUMENTS[i]} for i in order]
    relevance = [r["relevance_score"] for r in results]
    assert relevance == pytest.approx([expected[i] for i in order], abs=1e-4)
    assert body["usage"]["total_tokens"] > 0


def test_top_n_keeps_the_best_and_return_documents_false_leaves_the_text_out(server):
    everything = post(server, "/rerank", {"query": QUERY, "documents": DOCUMENTS, "top_n": 0})
    best_two = post(
        server, "/rerank",
        {"query": QUERY, "documents": DOCUMENTS, "top_n": 2, "return_documents": False},
    ).json()["results"]  # fmt: skip
    all_results = everything.json()["results"]
    assert len(all_results) == 4
    assert [r["index"] for r in best_two] == [r["index"] for r in all_results[:2]]
    assert all("document" not in r for r in best_two)


def test_classify_names_the_label_and_gives_its_probability(server, reference):
    response = post(server, "/classify", {"input": [QUERY, "w5"]})
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list" and body["id"].startswith("classify-")
    data = body["data"]
    assert [(d["index"], d["label"], d["num_classes"]) for d in data] == [
        (0, "label0", 1), (1, "label0", 1),
    ]  # fmt: skip
    expected = [[sigmoid(reference(QUERY))], [sigmoid(reference("w5"))]]
    assert [d["probs"] for d in data] == [pytest.approx(e, abs=1e-4) for e in expected]


def test_plain_pooling_gives_the_models_default_task_output(server, reference):
    response = post(server, "/pooling", {"input": [QUERY]})
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list" and body["id"].startswith("pool-")
    (item,) = body["data"]
    assert (item["index"], item["object"]) == (0, "pooling")
    assert item["data"] == pytest.approx([sigmoid(reference(QUERY))], abs=1e-4)
    encoded = post(server, "/pooling", {"input": QUERY, "encoding_format": "base64"}).json()
    decoded = np.frombuffer(base64.b64decode(encoded["data"][0]["data"]), dtype="<f4")
    assert decoded.tolist() == pytest.approx(item["data"], abs=1e-6)


def test_pooling_without_input_still_goes_to_the_io_processor(server):
    response = post(server, "/pooling", {"data": {"anything": 1}})
    assert response.status_code == 400
    assert "no IO processor is configured" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("path", "body", "param", "message"),
    [
        ("/rerank", {"query": QUERY, "documents": []}, "documents", "documents must not be empty"),
        (
            "/rerank",
            {"query": QUERY, "documents": DOCUMENTS, "top_n": -1},
            "top_n",
            "top_n must be >= 0",
        ),
        ("/rerank", {"query": QUERY, "documents": "w1"}, "documents", ""),
        ("/score", {"text_1": QUERY, "text_2": []}, "text_2", "at least one text_pair element"),
        ("/score", {"text_1": ["w1", "w2"], "text_2": DOCUMENTS}, "text_1", "1:1, 1:N or N:N"),
        ("/score", {"text_1": QUERY}, "text_2", "Field required"),
        ("/classify", {"input": []}, "input", "input must not be empty"),
        (
            "/classify",
            {"input": [[3, 10_000]]},
            "input",
            "input: Token id 10000 is out of vocabulary",
        ),
        (
            "/pooling",
            {"input": QUERY, "task": "token_classify"},
            "task",
            "Unsupported task: 'token_classify'",
        ),
        (
            "/pooling",
            {"input": QUERY, "dimensions": 4},
            "dimensions",
            "task 'classify' only supports",
        ),
        ("/v1/embeddings", {"input": QUERY}, "model", "Unsupported task: 'embed'"),
    ],
)
def test_bad_requests_are_400s_naming_the_field(server, path, body, param, message):
    response = post(server, path, body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param and message in error["message"]


def test_the_server_keeps_serving_after_bad_requests(server, reference):
    post(server, "/score", {"text_1": [], "text_2": DOCUMENTS})
    response = post(server, "/score", {"text_1": QUERY, "text_2": DOCUMENTS[0]})
    assert response.json()["data"][0]["score"] == pytest.approx(
        sigmoid(reference(QUERY, DOCUMENTS[0])), abs=1e-4
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("path", "body", "task"),
    [
        ("/score", {"text_1": "a", "text_2": ["b"]}, "score"),
        ("/rerank", {"query": "a", "documents": ["b"]}, "score"),
        ("/classify", {"input": "a"}, "classify"),
        ("/pooling", {"input": "a"}, "embed"),
    ],
)
def test_a_generating_model_asked_for_a_pooling_task_is_a_400_naming_it(
    default_server, path, body, task
):
    response = httpx.post(f"{default_server.url}{path}", json=body, timeout=60)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "model"
    assert f"--runner generate: it cannot {task} (Unsupported task: '{task}'" in error["message"]
