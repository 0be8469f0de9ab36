"""A real `core serve --trust-request-chat-template`: a request's template that builds
hundreds of MB with a size-taking filter is a 400, the server's own memory never holds the
string (its peak RSS), and the server answers the next request."""

from __future__ import annotations

import httpx
import pytest
from server_process import ServerProcess

pytestmark = pytest.mark.slow

USER = [{"role": "user", "content": "Hi"}]
TRICKS = [
    "{{ ('x'|center(300000000))|length }}",
    "{{ messages|tojson(indent=50000000) }}",
    "{{ ('%300000000s' % 'x')|length }}",
]


def peak_rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def test_a_requests_template_cannot_make_the_server_allocate():
    server = ServerProcess("--trust-request-chat-template").wait_ready()
    try:
        chat = f"{server.url}/v1/chat/completions"
        ok = {"messages": USER, "max_tokens": 1, "chat_template": "{{ messages[0].content }}"}
        assert httpx.post(chat, json=ok, timeout=60).status_code == 200  # the renderer is up
        for trick in TRICKS:
            with open(f"/proc/{server.proc.pid}/clear_refs", "w") as clear_refs:
                clear_refs.write("5")  # the server's peak RSS starts again from now
            before = peak_rss_bytes(server.proc.pid)
            body = {"messages": USER, "max_tokens": 1, "chat_template": trick}
            refused = httpx.post(chat, json=body, timeout=60)
            assert refused.status_code == 400, refused.text
            assert refused.json()["error"]["param"] == "chat_template"
            assert peak_rss_bytes(server.proc.pid) - before < 64 * 2**20, trick
        assert httpx.post(chat, json=ok, timeout=60).status_code == 200
    finally:
        server.stop()
