"""POST /pooling over a real InputProcessor and a stand-in engine that answers each prompt
with its token ids as text: the processor's answer keeps the prompts' order, data the
processor or the engine's validation refuses is a 400 naming `data` before anything runs,
a processor that breaks its contract is a 500, and a server without one says so."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from stand_in_engine import StandInEngine
from tiny_engine_checkpoint import engine_args, write_tiny_checkpoint

from core.config import UsageContext
from core.engine.processor import EngineSetup, InputProcessor
from core.entrypoints.openai.api_server import build_app
from core.io_processors import IOProcessor
from core.outputs import CompletionOutput, RequestOutput


class EchoEngine(StandInEngine):
    async def generate(self, request_id, prepared, *args, **kwargs):
        self.num_requests += 1
        text = " ".join(map(str, prepared.prompt_token_ids))
        sample = CompletionOutput(0, text, [], None, None, "length")
        yield RequestOutput(
            request_id, prepared.prompt, prepared.prompt_token_ids, None, [sample], finished=True
        )


class IdsProcessor(IOProcessor[object, list[str]]):
    """data {"ids": ...}: each item of `ids` a prompt as it is (token ids, text...)."""

    def parse_request(self, data):
        if not isinstance(data, dict) or "ids" not in data:
            raise ValueError('data must be {"ids": [prompt, ...]}')
        return data["ids"]

    def pre_process(self, data, request_id=None):
        return data

    def post_process(self, outputs, request_id=None):
        return [output.outputs[0].text for output in outputs]

    def output_to_response(self, output):
        return {"texts": output}


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> EngineSetup:
    model_dir = write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))
    return EngineSetup.from_engine_args(engine_args(model_dir), UsageContext.SERVING)


@pytest.fixture
def engine(setup) -> EchoEngine:
    engine = EchoEngine(InputProcessor(setup))
    engine.processor.io_processor = IdsProcessor(setup.config)
    return engine


@pytest.fixture
def client(engine) -> TestClient:
    return TestClient(build_app(engine), raise_server_exceptions=False)


def test_the_answer_keeps_the_order_of_the_prompts(client):
    response = client.post("/pooling", json={"data": {"ids": [[5, 6], [7], "w2"]}})
    assert response.status_code == 200, response.text
    assert response.json()["data"] == {"texts": ["5 6", "7", "8"]}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("w1", 'data must be {"ids": [prompt, ...]}'),
        ({"ids": [[5], [1000]]}, "prompt: Token id 1000 is out of vocabulary"),
        ({"ids": [[5], ""]}, "prompt: The decoder prompt cannot be empty"),
    ],
)
def test_refused_data_is_a_400_naming_data_and_nothing_runs(client, engine, data, message):
    response = client.post("/pooling", json={"data": data})
    assert response.status_code == 400
    assert response.json()["error"] | {"message": None} == {
        "message": None, "type": "invalid_request_error", "param": "data", "code": None,
    }  # fmt: skip
    assert response.json()["error"]["message"] == message
    assert engine.num_requests == 0


def test_a_processor_breaking_its_contract_is_a_500(client, engine):
    response = client.post("/pooling", json={"data": {"ids": 3.5}})  # not a prompt
    assert response.status_code == 500
    assert response.json()["error"]["message"] == "internal error"
    assert engine.num_requests == 0


def test_without_a_processor_every_request_is_a_400_saying_how_to_configure_one(setup):
    client = TestClient(build_app(EchoEngine(InputProcessor(setup))))
    response = client.post("/pooling", json={"data": {"ids": [[5]]}})
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith(
        "no IO processor is configured: start the engine with --io-processor-plugin NAME"
    )
