"""Routes vLLM serves that clients call, on a real `core serve` of the default model: the
openai client's models.retrieve, /tokenize's token strings, SageMaker's /ping and
/invocations."""

from __future__ import annotations

import httpx
import openai
import pytest

pytestmark = pytest.mark.slow


def test_models_retrieve_gives_the_listed_card_and_a_404_for_others(default_server):
    client = openai.OpenAI(base_url=f"{default_server.url}/v1", api_key="x", max_retries=0)
    (listed,) = client.models.list().data
    assert client.models.retrieve(listed.id) == listed
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_tokenize_returns_the_token_strings_when_asked(default_server):
    prompt = "Hello world, this is a test"
    url = f"{default_server.url}/tokenize"
    plain = httpx.post(url, json={"prompt": prompt, "add_special_tokens": False}).json()
    assert "token_strs" not in plain
    body = {"prompt": prompt, "add_special_tokens": False, "return_token_strs": True}
    asked = httpx.post(url, json=body).json()
    assert asked["tokens"] == plain["tokens"]
    assert len(asked["token_strs"]) == len(asked["tokens"])
    # Byte-level BPE spells a leading space "Ġ": the strings are the prompt cut in pieces.
    assert "".join(asked["token_strs"]).replace("Ġ", " ") == prompt


def test_invocations_answer_as_the_route_the_body_is_for(default_server):
    url = default_server.url
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0}
    invoked = httpx.post(f"{url}/invocations", json=chat, timeout=60).json()
    direct = httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=60).json()
    assert invoked["object"] == "chat.completion"
    assert invoked["choices"][0]["message"] == direct["choices"][0]["message"]
    completion = {"prompt": "Hi", "max_tokens": 2, "temperature": 0}
    assert httpx.post(f"{url}/invocations", json=completion, timeout=60).json()["object"] == (
        "text_completion"
    )
    assert httpx.get(f"{url}/ping").status_code == 200
    assert httpx.post(f"{url}/ping").status_code == 200
