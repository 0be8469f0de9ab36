"""/v1/embeddings on a server of a generating model: a 400 naming the runner, before any
engine work. The app runs over a real InputProcessor and a stand-in engine that must never
be asked to run anything."""

from __future__ import annotations

from fastapi.testclient import TestClient
from stand_in_engine import StandInEngine
from tiny_engine_checkpoint import engine_args, write_tiny_checkpoint

from core.config import UsageContext
from core.engine.processor import EngineSetup, InputProcessor
from core.entrypoints.openai.api_server import build_app


class IdleEngine(StandInEngine):
    """What build_app reads of AsyncLLM; `generate` fails the test if reached."""

    async def generate(self, *args, **kwargs):
        raise AssertionError("no request should reach the engine")
        yield


def test_embeddings_of_a_generating_model_are_a_400_naming_the_runner(tmp_path):
    setup = EngineSetup.from_engine_args(
        engine_args(write_tiny_checkpoint(tmp_path)), UsageContext.SERVING
    )
    client = TestClient(build_app(IdleEngine(InputProcessor(setup))))
    response = client.post("/v1/embeddings", json={"input": "w1 w2"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "model"
    assert "served with --runner generate: it cannot embed" in error["message"]
