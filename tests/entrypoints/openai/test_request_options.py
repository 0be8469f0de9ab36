"""`priority`, `cache_salt`, `kv_transfer_params` and X-Request-Id reach the engine as the
request asked, over a real InputProcessor (tiny checkpoint) and a stand-in engine that
records each call."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from stand_in_engine import StandInEngine
from tiny_engine_checkpoint import VOCAB, write_tiny_checkpoint

from core.config import UsageContext
from core.engine.processor import EngineSetup, InputProcessor
from core.engine_args import EngineArgs
from core.entrypoints.openai.api_server import build_app
from core.entrypoints.openai.frontend_args import FrontendArgs
from core.outputs import CompletionOutput, RequestOutput

PROMPT = "w1 w2 w3"
CHAT = [{"role": "user", "content": "w4 w5"}]


class RecordingEngine(StandInEngine):
    """What build_app uses of AsyncLLM; `generate` records its engine-side arguments and
    answers one token."""

    def __init__(self, processor: InputProcessor) -> None:
        super().__init__(processor)
        self.calls: list[dict] = []

    async def generate(self, request_id, prepared, priority=0, lora_request=None, cache_salt=None):
        extra = prepared.params.extra_args or {}
        self.calls.append({"request_id": request_id, "priority": priority, "salt": cache_salt,
                           "kv": extra.get("kv_transfer_params")})  # fmt: skip
        sample = CompletionOutput(0, "w7", [VOCAB["w7"]], None, None, finish_reason="length")
        answer = None if extra.get("kv_transfer_params") is None else {"remote_port": 1}
        yield RequestOutput(request_id, prepared.prompt, prepared.prompt_token_ids, None,
                            [sample], finished=True, kv_transfer_params=answer)  # fmt: skip


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))


def serve(model_dir: Path, policy: str, **engine) -> tuple[RecordingEngine, TestClient]:
    args = EngineArgs(model=str(model_dir), max_model_len=32, scheduling_policy=policy, **engine)
    setup = EngineSetup.from_engine_args(args, UsageContext.SERVING)
    engine = RecordingEngine(InputProcessor(setup))
    app = build_app(engine, frontend=FrontendArgs(disable_log_stats=True))
    return engine, TestClient(app, raise_server_exceptions=False)


def test_priority_and_cache_salt_reach_the_engine_under_the_priority_policy(model_dir):
    engine, client = serve(model_dir, "priority")
    body = {"prompt": [PROMPT, PROMPT], "max_tokens": 1, "priority": -3, "cache_salt": "tenant-a"}
    assert client.post("/v1/completions", json=body).status_code == 200
    chat = {"messages": CHAT, "max_tokens": 1, "priority": 7}
    assert client.post("/v1/chat/completions", json=chat).status_code == 200
    assert [(c["priority"], c["salt"]) for c in engine.calls] == [
        (-3, "tenant-a"), (-3, "tenant-a"), (7, None)
    ]  # fmt: skip


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_a_nonzero_priority_under_fcfs_is_a_400_naming_priority(model_dir, route):
    engine, client = serve(model_dir, "fcfs")
    body = {"prompt": PROMPT, "messages": CHAT, "max_tokens": 1, "priority": 1}
    response = client.post(route, json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "priority"
    assert "--scheduling-policy priority" in error["message"]
    assert engine.calls == []
    zero = client.post(route, json={**body, "priority": 0})
    assert zero.status_code == 200


def test_an_empty_cache_salt_is_a_400_naming_it(model_dir):
    _, client = serve(model_dir, "fcfs")
    response = client.post("/v1/completions", json={"prompt": PROMPT, "cache_salt": ""})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "cache_salt"


def test_x_request_id_is_the_engine_request_id_and_is_echoed(model_dir):
    engine, client = serve(model_dir, "fcfs")
    body = {"prompt": [PROMPT, PROMPT], "max_tokens": 1}
    response = client.post("/v1/completions", json=body, headers={"X-Request-Id": "trace-9"})
    assert response.headers["x-request-id"] == "trace-9"
    assert [c["request_id"] for c in engine.calls] == ["trace-9-0", "trace-9-1"]
    plain = client.post("/v1/completions", json=body)
    assert "x-request-id" not in plain.headers
    assert [c["request_id"] for c in engine.calls[2:]] == ["req-0-0", "req-0-1"]


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_kv_transfer_params_reach_the_connector_and_its_answer_the_client(model_dir, route):
    engine, client = serve(model_dir, "fcfs", kv_transfer_config='{"kv_connector": "p2p"}')
    asked = {"do_remote_decode": True}
    body = {"prompt": PROMPT, "messages": CHAT, "max_tokens": 1, "kv_transfer_params": asked}
    response = client.post(route, json=body)
    assert response.status_code == 200
    assert engine.calls[0]["kv"] == asked
    assert response.json()["kv_transfer_params"] == {"remote_port": 1}


def test_kv_transfer_params_without_a_connector_are_a_400_naming_them(model_dir):
    engine, client = serve(model_dir, "fcfs")
    body = {"prompt": PROMPT, "kv_transfer_params": {"do_remote_decode": True}}
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "kv_transfer_params"
    assert engine.calls == []
