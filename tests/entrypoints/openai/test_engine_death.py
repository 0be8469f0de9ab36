"""A dead engine core gets one answer, over a real InputProcessor (tiny checkpoint) and a
stand-in engine: a 503 with code "engine_dead" whether the request streams or not; a
stream that loses the engine mid-way ends with the same error as its last event; /metrics
stops reporting the dead engine's requests. A request the server aborts (its shutdown
deadline) ends a stream with finish_reason "abort" and is a 503 without streaming."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from stand_in_engine import StandInEngine
from tiny_engine_checkpoint import VOCAB, write_tiny_checkpoint

from core.config import UsageContext
from core.engine.core_client import EngineDeadError
from core.engine.processor import EngineSetup, InputProcessor
from core.engine.protocol import SchedulerStats
from core.engine.stats import IterationStats
from core.engine_args import EngineArgs
from core.entrypoints.openai.api_server import build_app
from core.entrypoints.openai.frontend_args import FrontendArgs
from core.outputs import CompletionOutput, RequestOutput

ROUTES = {
    "/v1/completions": {"prompt": "w1 w2", "max_tokens": 4},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "w1"}], "max_tokens": 4},
}


class ScriptedEngine(StandInEngine):
    """`generate` answers one token, then ends as `ending` says: "dies" (the engine core
    is killed: EngineDeadError) or "aborted" (the server aborts it)."""

    def __init__(self, processor: InputProcessor, ending: str = "dies") -> None:
        super().__init__(processor)
        self.ending = ending

    async def generate(self, request_id, prepared, priority=0, lora_request=None, cache_salt=None):
        def output(token_ids: list[int], finish_reason: str | None) -> RequestOutput:
            text = "w7" if token_ids else ""
            sample = CompletionOutput(0, text, token_ids, None, None, finish_reason=finish_reason)
            return RequestOutput(request_id, prepared.prompt, prepared.prompt_token_ids, None,
                                 [sample], finished=finish_reason is not None)  # fmt: skip

        yield output([VOCAB["w7"]], None)
        if self.ending == "dies":
            self.is_healthy = False
            raise EngineDeadError("engine core process exited (code -9)")
        yield output([], "abort")


@pytest.fixture(scope="module")
def processor(tmp_path_factory) -> InputProcessor:
    model_dir = write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))
    args = EngineArgs(model=str(model_dir), max_model_len=32)
    return InputProcessor(EngineSetup.from_engine_args(args, UsageContext.SERVING))


def serve(engine: StandInEngine) -> TestClient:
    app = build_app(engine, frontend=FrontendArgs(disable_log_stats=True))
    return TestClient(app, raise_server_exceptions=False)


def events(response) -> list:
    """A stream's SSE data: JSON objects, then "[DONE]"."""
    data = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    return [d if d == "[DONE]" else json.loads(d) for d in data]


@pytest.mark.parametrize("route", ROUTES)
def test_a_dead_engine_is_a_503_engine_dead_streaming_or_not(processor, route):
    engine = ScriptedEngine(processor)
    engine.is_healthy = False
    client = serve(engine)
    plain = client.post(route, json=ROUTES[route])
    streamed = client.post(route, json={**ROUTES[route], "stream": True})
    assert (plain.status_code, streamed.status_code) == (503, 503)
    assert plain.json() == streamed.json()
    error = plain.json()["error"]
    assert (error["type"], error["code"]) == ("server_error", "engine_dead")
    assert client.get("/health").json() == plain.json()


@pytest.mark.parametrize("route", ROUTES)
def test_a_stream_that_loses_its_engine_ends_with_the_503s_error(processor, route):
    client = serve(ScriptedEngine(processor))
    response = client.post(route, json={**ROUTES[route], "stream": True})
    assert response.status_code == 200
    *chunks, error, done = events(response)
    assert done == "[DONE]" and chunks
    plain = client.post(route, json=ROUTES[route])  # the engine is dead by now
    assert plain.status_code == 503

    def kind(body: dict) -> tuple:
        return body["error"]["type"], body["error"]["param"], body["error"]["code"]

    assert kind(error) == kind(plain.json()) == ("server_error", None, "engine_dead")
    assert error["error"]["message"] == "engine unavailable: engine core process exited (code -9)"


def test_metrics_stop_reporting_the_requests_of_a_dead_engine(processor):
    engine = ScriptedEngine(processor)
    client = serve(engine)
    stats = SchedulerStats(
        num_running=3, num_waiting=2, kv_cache_usage=0.5,
        prefix_cache_queries=0, prefix_cache_hits=0, num_preemptions=0,
    )  # fmt: skip
    for listener in engine.stats_listeners:
        listener(IterationStats(0, stats))
    assert gauges(client.get("/metrics").text) == (3, 2, 0.5)
    engine.is_healthy = False
    assert gauges(client.get("/metrics").text) == (0, 0, 0)


def gauges(text: str) -> tuple[float, float, float]:
    """Requests running, waiting, and the KV-cache usage, as /metrics shows them."""
    values = {
        s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
    }  # fmt: skip
    return tuple(
        values[f"vllm:{name}"]
        for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc")
    )


@pytest.mark.parametrize("route", ROUTES)
def test_an_aborted_request_ends_its_stream_with_abort_and_is_a_503_otherwise(processor, route):
    client = serve(ScriptedEngine(processor, ending="aborted"))
    streamed = client.post(route, json={**ROUTES[route], "stream": True})
    assert streamed.status_code == 200
    *_, last, done = events(streamed)
    assert done == "[DONE]" and last["choices"][0]["finish_reason"] == "abort"
    plain = client.post(route, json=ROUTES[route])
    assert plain.status_code == 503
    assert (plain.json()["error"]["type"], plain.json()["error"]["code"]) == (
        "server_error",
        "aborted",
    )
