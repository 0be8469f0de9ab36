"""Every error of the app is an OpenAI error body with the right status: checked on the
wire with a tiny FastAPI app, and through the real openai client."""

from __future__ import annotations

import json
import logging

import openai
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from core.entrypoints.openai.errors import (
    OpenAIError,
    error_body,
    error_response,
    install_error_handlers,
)
from core.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest


def make_app() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest) -> dict:
        if req.model == "missing":
            raise OpenAIError(404, "The model `missing` does not exist.", param="model",
                              code="model_not_found")  # fmt: skip
        if req.prompt == "engine says no":
            raise ValueError("prompt is 9000 tokens long, but max_model_len is 2048")
        if req.prompt == "crash":
            raise RuntimeError("secret detail")
        return {"prompts": req.prompts()}

    @app.post("/v1/chat/completions")
    async def chat(req: ChatCompletionRequest) -> dict:
        return {"conversation": req.conversation()}

    return app


@pytest.fixture(scope="module")
def client() -> TestClient:
    # The 500 test needs the response, not the exception re-raised into the test.
    return TestClient(make_app(), raise_server_exceptions=False)


def body(message, param=None, type="invalid_request_error", code=None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def test_error_body_has_openai_shape():
    assert error_body("m", "t") == body("m", type="t")
    assert error_body("m", "t", "p", "c") == body("m", "p", "t", "c")


def test_a_message_quoting_a_lone_surrogate_is_sent_with_it_escaped():
    # UTF-8 cannot carry the surrogate itself: sent as is, the error would become a 500.
    response = error_response(OpenAIError(400, "model `\ud800` does not exist"))
    assert json.loads(response.body)["error"]["message"] == "model `\\ud800` does not exist"


def test_a_streams_error_event_escapes_a_lone_surrogate_as_the_response_does():
    error = OpenAIError(400, "stop `\ud800` cannot be tokenized")
    event = json.dumps(error.body(), ensure_ascii=False)  # as a stream's SSE data
    event.encode("utf-8")  # a surrogate left in would raise here and break the stream off
    assert json.loads(event) == json.loads(error_response(error).body)


def test_good_request_passes_through(client):
    response = client.post("/v1/completions", json={"prompt": [1, 2], "extra": 1})
    assert (response.status_code, response.json()) == (200, {"prompts": [[1, 2]]})


def test_malformed_json_is_400(client):
    response = client.post(
        "/v1/completions", content=b'{"prompt": "x",', headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["message"].startswith("malformed JSON body: ")
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", None, None)


def test_missing_body_is_400(client):
    response = client.post("/v1/completions")
    assert response.status_code == 400
    assert response.json() == body("the request body (a JSON object) is missing")


def test_non_object_body_is_400(client):
    response = client.post("/v1/completions", json=[1, 2])
    assert response.status_code == 400
    assert response.json()["error"]["param"] is None


@pytest.mark.parametrize(
    ("payload", "param", "message"),
    [
        ({"prompt": "x", "max_tokens": "5"}, "max_tokens",
         "max_tokens: Input should be a valid integer"),
        ({}, "prompt", "prompt: Field required"),
        ({"prompt": "x", "logprobs": 21}, "logprobs",
         "logprobs: Input should be less than or equal to 20"),
        ({"prompt": "x", "suffix": "y"}, "suffix", "suffix: suffix is not supported"),
        ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options",
         "stream_options: stream_options is only allowed when stream is true"),
        ({"prompt": "x", "structured_outputs": {"json": 3}}, "structured_outputs.json", None),
        ({"prompt": "x", "logit_bias": {"7": "x"}}, "logit_bias", None),
        ({"prompt": "x", "n": 129}, "n", "n: Input should be less than or equal to 128"),
    ],
)  # fmt: skip
def test_validation_error_is_400_naming_the_field(client, payload, param, message):
    response = client.post("/v1/completions", json=payload)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param
    if message is not None:
        assert error == body(message, param)["error"]


def test_nested_validation_error_names_the_path(client):
    audio = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    response = client.post(
        "/v1/chat/completions", json={"messages": [{"role": "user", "content": [audio]}]}
    )
    assert response.status_code == 400
    assert response.json() == body(
        "messages[0].content[0]: content part type 'input_audio' is not supported (text, "
        "image_url, input_image)",
        "messages[0].content[0]",
    )


def test_union_member_tags_do_not_leak_into_param(client):
    response = client.post("/v1/completions", json={"prompt": "x", "stop": 5})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "stop"
    messages = [{"role": "user", "content": [{"type": "text", "text": 5}]}]
    response = client.post("/v1/chat/completions", json={"messages": messages})
    assert response.json()["error"]["param"] == "messages[0].content[0].text"


def test_unknown_route_is_404_in_openai_shape(client):
    response = client.post("/v1/nope", json={})
    assert response.status_code == 404
    assert response.json() == body("Invalid URL (POST /v1/nope)")


def test_wrong_method_is_405_in_openai_shape(client):
    response = client.get("/v1/completions")
    assert response.status_code == 405
    assert response.json() == body("Method Not Allowed")


def test_openai_error_keeps_its_status_param_and_code(client):
    response = client.post("/v1/completions", json={"model": "missing", "prompt": "x"})
    assert response.status_code == 404
    assert response.json() == body(
        "The model `missing` does not exist.", "model", code="model_not_found"
    )


def test_value_error_from_the_engine_is_400(client):
    response = client.post("/v1/completions", json={"prompt": "engine says no"})
    assert response.status_code == 400
    assert response.json() == body("prompt is 9000 tokens long, but max_model_len is 2048")


def test_unexpected_exception_is_500_without_details_and_is_logged(client, caplog):
    with caplog.at_level(logging.ERROR, logger="core.entrypoints.openai.errors"):
        response = client.post("/v1/completions", json={"prompt": "crash"})
    assert response.status_code == 500
    assert response.json() == body("internal error", type="server_error")
    assert "secret detail" not in response.text
    assert any("POST /v1/completions" in r.getMessage() and r.exc_info for r in caplog.records)


def test_openai_client_reads_our_errors():
    http = TestClient(make_app(), raise_server_exceptions=False)
    client = openai.OpenAI(
        base_url="http://testserver/v1", api_key="unused", http_client=http, max_retries=0
    )
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model="m", prompt="x", max_tokens=5, extra_body={"n": "2"})
    assert bad.value.status_code == 400 and bad.value.param == "n"
    with pytest.raises(openai.NotFoundError) as missing:
        client.completions.create(model="missing", prompt="x")
    assert missing.value.code == "model_not_found"
    assert missing.value.message == "Error code: 404 - The model `missing` does not exist."
