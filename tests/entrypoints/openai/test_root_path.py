"""`core serve --root-path /llm`: routes answer with the prefix (clients talking to the server
directly) and without it (a proxy stripped it), and the open routes stay open under
--api-key either way."""

from __future__ import annotations

import httpx
import openai
import pytest
from server_process import ServerProcess

pytestmark = pytest.mark.slow

KEY = "sesame"


@pytest.fixture(scope="module")
def server():
    server = ServerProcess("--root-path", "/llm", "--api-key", KEY).wait_ready()
    yield server
    server.stop()


@pytest.mark.parametrize("prefix", ["/llm", ""], ids=["prefixed", "stripped"])
def test_chat_answers_at_both_paths(server, prefix):
    client = openai.OpenAI(base_url=f"{server.url}{prefix}/v1", api_key=KEY, max_retries=0)
    reply = client.chat.completions.create(
        model=None, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
    )
    assert reply.choices[0].message.content is not None


@pytest.mark.parametrize("prefix", ["/llm", ""], ids=["prefixed", "stripped"])
def test_open_routes_stay_open_and_the_others_need_the_key(server, prefix):
    assert httpx.get(f"{server.url}{prefix}/health").status_code == 200
    assert httpx.get(f"{server.url}{prefix}/version").status_code == 200
    assert httpx.get(f"{server.url}{prefix}/v1/models").status_code == 401
    authorized = {"Authorization": f"Bearer {KEY}"}
    assert httpx.get(f"{server.url}{prefix}/v1/models", headers=authorized).status_code == 200
