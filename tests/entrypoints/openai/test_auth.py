"""--api-key: every route but the liveness probes needs the key; the Bearer scheme is
case-insensitive (RFC 7235) and a 401 names the scheme it wants."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient
from stand_in_engine import StandInEngine
from tiny_engine_checkpoint import engine_args, write_tiny_checkpoint

from core.config import UsageContext
from core.engine.processor import EngineSetup, InputProcessor
from core.entrypoints.cli import cli
from core.entrypoints.openai.api_server import build_app
from core.entrypoints.openai.frontend_args import FrontendArgs

KEY = "sesame"


class IdleEngine(StandInEngine):
    async def generate(self, *args, **kwargs):
        raise AssertionError("no request should reach the engine")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))


def app_for(model_dir, frontend: FrontendArgs = FrontendArgs()) -> TestClient:
    setup = EngineSetup.from_engine_args(engine_args(model_dir), UsageContext.SERVING)
    return TestClient(build_app(IdleEngine(InputProcessor(setup)), KEY, frontend=frontend))


@pytest.fixture(scope="module")
def client(model_dir) -> TestClient:
    return app_for(model_dir)


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("get", "/v1/models", None),
        ("post", "/tokenize", {"prompt": "w1"}),
        ("post", "/detokenize", {"tokens": [5]}),
        ("get", "/metrics", None),
    ],
)
def test_every_route_but_the_probes_needs_the_key(client, method, path, body):
    kwargs = {} if body is None else {"json": body}
    refused = getattr(client, method)(path, **kwargs)
    assert refused.status_code == 401
    assert refused.headers["www-authenticate"] == "Bearer"
    assert refused.json()["error"]["code"] == "invalid_api_key"
    allowed = getattr(client, method)(path, headers={"Authorization": f"Bearer {KEY}"}, **kwargs)
    assert allowed.status_code == 200


def test_liveness_probes_stay_open(client):
    assert client.get("/health").status_code == 200
    assert client.head("/health").status_code == 200  # load balancers probe with HEAD too
    assert client.get("/version").status_code == 200


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER", "bEaReR"])
def test_the_bearer_scheme_is_case_insensitive(client, scheme):
    response = client.get("/v1/models", headers={"Authorization": f"{scheme} {KEY}"})
    assert response.status_code == 200


@pytest.mark.parametrize("header", [f"Basic {KEY}", KEY, "Bearer", f"Bearer {KEY}x"])
def test_other_schemes_and_wrong_keys_are_refused(client, header):
    assert client.get("/v1/models", headers={"Authorization": header}).status_code == 401


def test_metrics_without_api_key_opens_metrics_alone(model_dir):
    scraped = app_for(model_dir, FrontendArgs(metrics_without_api_key=True))
    assert scraped.get("/metrics").status_code == 200
    assert scraped.get("/v1/models").status_code == 401
    assert scraped.post("/tokenize", json={"prompt": "w1"}).status_code == 401


def test_metrics_without_api_key_needs_an_api_key(model_dir):
    result = CliRunner().invoke(cli, ["serve", str(model_dir), "--metrics-without-api-key"])
    assert result.exit_code == 1
    assert "--metrics-without-api-key: only means something with --api-key" in result.output
