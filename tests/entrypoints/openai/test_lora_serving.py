"""The server's side of LoRA serving, without an engine core: `--lora-modules`, /v1/models,
the `model` field choosing an adapter, the runtime load/unload routes and their guards.

The app is built over a real InputProcessor (tiny checkpoint, --enable-lora) whose
`check_lora` asks a files-only LoRA implementation (below) instead of core-lora, and a
stand-in engine that records the adapter each request reaches `generate` with. Generation
with real adapters is in test_lora_server.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from stand_in_engine import StandInEngine
from tiny_engine_checkpoint import VOCAB, write_tiny_checkpoint

from core.config import LoRAConfig, UsageContext
from core.engine import processor as processor_module
from core.engine.processor import EngineSetup, InputProcessor
from core.engine.protocol import SchedulerStats
from core.engine.stats import IterationStats
from core.engine_args import EngineArgs
from core.entrypoints.cli import cli
from core.entrypoints.openai.api_server import build_app
from core.entrypoints.openai.serving_models import LoRAModulePath
from core.lora.interface import LoRAManager
from core.lora.request import LoRARequest
from core.outputs import CompletionOutput, RequestOutput

API_KEY = "sesame"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
TOKEN = "w7"  # what the stand-in engine generates


class FilesOnlyLoRA(LoRAManager):
    """A `core.lora` implementation that only checks adapters: the directory must hold
    adapter_config.json with a rank within --max-lora-rank."""

    @classmethod
    def check_adapter(cls, model, request: LoRARequest, config: LoRAConfig) -> None:
        adapter_config = Path(request.lora_path) / "adapter_config.json"
        if not adapter_config.is_file():
            raise ValueError(f"LoRA adapter '{request.lora_name}': lora_path: no {adapter_config}")
        rank = json.loads(adapter_config.read_text())["r"]
        if rank > config.max_lora_rank:
            raise ValueError(f"LoRA adapter '{request.lora_name}': r: {rank} is too high")


class LoRAStandInEngine(StandInEngine):
    """What build_app uses of AsyncLLM: a real processor; `generate` checks the adapter as
    AsyncLLM does, records it, and answers one token."""

    def __init__(self, processor: InputProcessor) -> None:
        super().__init__(processor)
        self.lora_requests: list[LoRARequest | None] = []

    async def generate(self, request_id, prepared, priority=0, lora_request=None, cache_salt=None):
        if lora_request is not None:
            self.processor.check_lora(lora_request)
        self.lora_requests.append(lora_request)
        sample = CompletionOutput(0, TOKEN, [VOCAB[TOKEN]], None, None, finish_reason="length")
        yield RequestOutput(request_id, prepared.prompt, prepared.prompt_token_ids, None,
                            [sample], finished=True)  # fmt: skip


def write_adapter(directory: Path, rank: int = 8) -> str:
    directory.mkdir(parents=True)
    (directory / "adapter_config.json").write_text(json.dumps({"r": rank}))
    return str(directory)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("adapters")
    return {name: write_adapter(root / name) for name in ("alpha", "beta", "gamma")}


@pytest.fixture(scope="module", autouse=True)
def files_only_lora():
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(processor_module, "lora_manager_class", lambda *_: FilesOnlyLoRA)
        yield


def make_engine(model_dir: Path, **lora: object) -> LoRAStandInEngine:
    args = EngineArgs(model=str(model_dir), max_model_len=32, **lora)
    return LoRAStandInEngine(
        InputProcessor(EngineSetup.from_engine_args(args, UsageContext.SERVING))
    )


def lora_engine(model_dir: Path) -> LoRAStandInEngine:
    return make_engine(model_dir, enable_lora=True, max_loras=2, max_lora_rank=8)


def app_client(engine: LoRAStandInEngine, modules=(), api_key: str | None = None) -> TestClient:
    return TestClient(build_app(engine, api_key, modules), raise_server_exceptions=False)


@pytest.fixture
def engine(model_dir) -> LoRAStandInEngine:
    return lora_engine(model_dir)


@pytest.fixture
def client(engine, adapters) -> TestClient:
    modules = [LoRAModulePath("alpha", adapters["alpha"]), LoRAModulePath("beta", adapters["beta"])]
    return app_client(engine, modules)


@pytest.fixture
def runtime_updates(monkeypatch):
    monkeypatch.setenv("CORE_ALLOW_RUNTIME_LORA_UPDATING", "1")


@pytest.fixture
def updatable(runtime_updates, client) -> TestClient:
    """`client`, built while CORE_ALLOW_RUNTIME_LORA_UPDATING=1."""
    return client


def not_found(message: str, param: str, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": "NotFoundError", "param": param, "code": code}}


def bad_request(message: str, param: str | None) -> dict:
    error = {"message": message, "type": "invalid_request_error", "param": param, "code": None}
    return {"error": error}


# -- --lora-modules ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("sql=/adapters/sql", LoRAModulePath("sql", "/adapters/sql")),
        ("eq=/a=b", LoRAModulePath("eq", "/a=b")),  # the first '=' separates
        ('{"name": "sql", "path": "/a"}', LoRAModulePath("sql", "/a")),
        (
            '{"name": "sql", "path": "/a", "base_model_name": "llama"}',
            LoRAModulePath("sql", "/a", "llama"),
        ),
    ],
)
def test_lora_module_is_name_equals_path_or_vllm_json(text, expected):
    assert LoRAModulePath.parse(text) == expected


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("sql", "neither name=path nor a JSON object"),
        ("=/a", "neither name=path nor a JSON object"),
        ("sql=", "neither name=path nor a JSON object"),
        ('{"name": "sql"', "must be a JSON object"),
        ('{"name": "sql"}', "missing ['path']"),
        ('{"name": "", "path": "/a"}', "['name'] must be non-empty strings"),
        ('{"name": "sql", "path": "/a", "rank": 8}', "unknown keys ['rank']"),
    ],
)
def test_malformed_lora_module_says_why(text, reason):
    with pytest.raises(ValueError) as error:
        LoRAModulePath.parse(text)
    assert str(error.value).startswith(repr(text)) and reason in str(error.value)


def serve_params(*args: str) -> dict:
    """The parameters `core serve ARGS` would run with (parsed, not run)."""
    return cli.commands["serve"].make_context("serve", list(args)).params


def test_one_lora_modules_flag_takes_several_values_and_repeats():
    params = serve_params(
        "/models/base",
        "--lora-modules", "a=/x", '{"name": "b", "path": "/y"}',
        "--port", "9000",
        "--lora-modules=c=/z", "d=/w",
    )  # fmt: skip
    assert params["lora_modules"] == (
        LoRAModulePath("a", "/x"),
        LoRAModulePath("b", "/y"),
        LoRAModulePath("c", "/z"),
        LoRAModulePath("d", "/w"),
    )
    assert (params["model_tag"], params["port"]) == ("/models/base", 9000)


def test_bad_lora_module_is_a_usage_error():
    result = CliRunner().invoke(cli, ["serve", "--lora-modules", "a=/x", "nonsense"])
    assert result.exit_code == 2
    assert "Invalid value for '--lora-modules': 'nonsense' is neither name=path" in result.output


def test_lora_modules_without_enable_lora_fails_before_the_engine_starts(model_dir):
    result = CliRunner().invoke(cli, ["serve", str(model_dir), "--lora-modules", "a=/x"])
    assert result.exit_code == 1
    assert "--lora-modules: serving LoRA adapters needs --enable-lora" in result.output


def test_startup_adapters_get_ids_one_two_in_order(engine, client, adapters):
    client.post("/v1/completions", json={"model": "beta", "prompt": "w1"})
    client.post("/v1/completions", json={"model": "alpha", "prompt": "w1"})
    assert engine.lora_requests == [
        LoRARequest("beta", 2, adapters["beta"]),
        LoRARequest("alpha", 1, adapters["alpha"]),
    ]


@pytest.mark.parametrize(
    ("modules", "reason"),
    [
        ([("a", "missing")], "lora_path: no missing/adapter_config.json"),
        ([("a", "ok"), ("a", "ok")], "The lora adapter 'a' has already been loaded."),
        ([("a", "high")], "LoRA adapter 'a': r: 16 is too high"),
    ],
)
def test_adapter_that_cannot_be_served_stops_startup(model_dir, tmp_path, modules, reason):
    write_adapter(tmp_path / "ok")
    write_adapter(tmp_path / "high", rank=16)
    paths = [LoRAModulePath(name, str(tmp_path / path)) for name, path in modules]
    with pytest.raises(ValueError) as error:
        build_app(lora_engine(model_dir), None, paths)
    assert str(error.value).startswith(f"--lora-modules a={paths[-1].path}: ")
    assert reason.replace("missing", str(tmp_path / "missing")) in str(error.value)


def test_adapter_named_like_the_base_model_stops_startup(model_dir, adapters):
    with pytest.raises(ValueError, match="'tiny.*' is the base model's name"):
        build_app(lora_engine(model_dir), None, [LoRAModulePath(model_dir.name, adapters["alpha"])])


def test_lora_modules_on_an_engine_without_lora_name_both_flags(model_dir, adapters):
    with pytest.raises(ValueError) as error:
        build_app(make_engine(model_dir), None, [LoRAModulePath("alpha", adapters["alpha"])])
    assert str(error.value).startswith("--lora-modules alpha=")
    assert "--enable-lora" in str(error.value)


# -- /v1/models and the `model` field ---------------------------------------------------------


def test_models_lists_the_base_model_then_each_adapter_with_its_parent(client, adapters, model_dir):
    cards = client.get("/v1/models").json()["data"]
    base = model_dir.name
    assert [(c["id"], c["root"], c["parent"]) for c in cards] == [
        (base, str(model_dir), None),
        ("alpha", adapters["alpha"], base),
        ("beta", adapters["beta"], base),
    ]
    assert all(c["object"] == "model" and c["max_model_len"] == 32 for c in cards)


def test_base_model_name_of_a_json_module_is_its_parent(engine, adapters):
    module = LoRAModulePath("alpha", adapters["alpha"], base_model_name="llama-base")
    cards = app_client(engine, [module]).get("/v1/models").json()["data"]
    assert cards[1]["parent"] == "llama-base"


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("stream", [False, True])
def test_model_field_picks_the_adapter_and_the_response_echoes_it(
    engine, client, adapters, model_dir, path, stream
):
    prompt = {"prompt": "w1 w2"} if path == "/v1/completions" else {
        "messages": [{"role": "user", "content": "w1"}]
    }  # fmt: skip
    for model in ("beta", model_dir.name, None):
        body = {**prompt, "stream": stream, **({"model": model} if model else {})}
        response = client.post(path, json=body)
        assert response.status_code == 200, response.text
        chunks = (
            [json.loads(line[6:]) for line in response.text.splitlines() if line[6:7] == "{"]
            if stream
            else [response.json()]
        )
        assert chunks and {c["model"] for c in chunks} == {model or model_dir.name}
    assert engine.lora_requests == [LoRARequest("beta", 2, adapters["beta"]), None, None]


def test_openai_client_chats_with_an_adapter(client):
    api = openai.OpenAI(
        base_url="http://testserver/v1", api_key="unused", http_client=client, max_retries=0
    )
    reply = api.chat.completions.create(
        model="alpha", messages=[{"role": "user", "content": "w1"}], max_tokens=1
    )
    assert (reply.model, reply.choices[0].message.content) == ("alpha", TOKEN)
    with pytest.raises(openai.NotFoundError) as missing:
        api.chat.completions.create(model="delta", messages=[{"role": "user", "content": "w1"}])
    assert missing.value.code == "model_not_found"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": "w1"}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w1"}]}),
        ("/tokenize", {"prompt": "w1"}),
        ("/detokenize", {"tokens": [3]}),
    ],
)
def test_unknown_model_is_a_404_naming_it(engine, client, path, body):
    response = client.post(path, json={**body, "model": "delta"})
    assert response.status_code == 404
    assert response.json() == not_found(
        "The model `delta` does not exist.", "model", "model_not_found"
    )
    assert engine.lora_requests == []


def test_tokenize_answers_for_an_adapter_name(client):
    response = client.post("/tokenize", json={"model": "alpha", "prompt": "w1 w2"})
    assert response.status_code == 200
    assert response.json()["tokens"] == [VOCAB["w1"], VOCAB["w2"]]


# -- runtime load / unload --------------------------------------------------------------------


def load(client: TestClient, name: str, path: str, headers=None):
    body = {"lora_name": name, "lora_path": path}
    return client.post("/v1/load_lora_adapter", json=body, headers=headers)


def unload(client: TestClient, name: str, headers=None):
    return client.post("/v1/unload_lora_adapter", json={"lora_name": name}, headers=headers)


def model_ids(client: TestClient, headers=None) -> list[str]:
    return [c["id"] for c in client.get("/v1/models", headers=headers).json()["data"]]


@pytest.mark.parametrize("value", ["", "0", "false", "yes"])
def test_runtime_routes_are_unknown_unless_the_variable_allows_them(
    engine, adapters, monkeypatch, value
):
    monkeypatch.setenv("CORE_ALLOW_RUNTIME_LORA_UPDATING", value)
    client = app_client(engine)
    response = load(client, "gamma", adapters["gamma"])
    assert response.status_code == 404
    assert response.json()["error"]["message"] == "Invalid URL (POST /v1/load_lora_adapter)"
    assert unload(client, "gamma").status_code == 404


@pytest.mark.parametrize("value", ["1", "true", "True"])
def test_runtime_routes_are_served_when_the_variable_allows_them(
    engine, adapters, monkeypatch, value
):
    monkeypatch.setenv("CORE_ALLOW_RUNTIME_LORA_UPDATING", value)
    assert load(app_client(engine), "gamma", adapters["gamma"]).status_code == 200


def test_runtime_routes_are_unknown_without_enable_lora(model_dir, adapters, runtime_updates):
    client = app_client(make_engine(model_dir))
    assert load(client, "gamma", adapters["gamma"]).status_code == 404


def test_load_then_unload_an_adapter_at_runtime(engine, updatable, adapters):
    response = load(updatable, "gamma", adapters["gamma"])
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    assert response.text == "Success: LoRA adapter 'gamma' added successfully."
    assert model_ids(updatable)[1:] == ["alpha", "beta", "gamma"]
    assert (
        updatable.post("/v1/completions", json={"model": "gamma", "prompt": "w1"}).status_code
        == 200
    )
    assert engine.lora_requests == [LoRARequest("gamma", 3, adapters["gamma"])]

    response = unload(updatable, "gamma")
    assert (response.status_code, response.text) == (
        200,
        "Success: LoRA adapter 'gamma' removed successfully.",
    )
    assert model_ids(updatable)[1:] == ["alpha", "beta"]
    gone = updatable.post("/v1/completions", json={"model": "gamma", "prompt": "w1"})
    assert gone.status_code == 404


def test_reloaded_adapter_gets_a_new_id(engine, updatable, adapters):
    load(updatable, "gamma", adapters["gamma"])
    unload(updatable, "gamma")
    assert load(updatable, "gamma", adapters["beta"]).status_code == 200
    updatable.post("/v1/completions", json={"model": "gamma", "prompt": "w1"})
    assert engine.lora_requests == [LoRARequest("gamma", 4, adapters["beta"])]


def test_loading_a_served_name_is_a_400(updatable, adapters):
    response = load(updatable, "alpha", adapters["gamma"])
    assert response.status_code == 400
    assert response.json() == bad_request(
        "The lora adapter 'alpha' has already been loaded.", "lora_name"
    )
    assert model_ids(updatable)[1:] == ["alpha", "beta"]


def test_loading_an_adapter_the_engine_refuses_is_a_400_with_its_reason(updatable, tmp_path):
    high = write_adapter(tmp_path / "high", rank=16)
    response = load(updatable, "gamma", high)
    assert response.status_code == 400
    assert response.json() == bad_request("LoRA adapter 'gamma': r: 16 is too high", "lora_path")
    assert "gamma" not in model_ids(updatable)


def test_unloading_an_unknown_adapter_is_a_404(updatable):
    response = unload(updatable, "gamma")
    assert response.status_code == 404
    assert response.json() == not_found("The lora adapter 'gamma' cannot be found.", "lora_name")


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/load_lora_adapter", {"lora_path": "/x"}, "lora_name"),
        ("/v1/load_lora_adapter", {"lora_name": "gamma"}, "lora_path"),
        ("/v1/unload_lora_adapter", {}, "lora_name"),
    ],
)
def test_missing_field_is_a_400_naming_it(updatable, path, body, field):
    response = updatable.post(path, json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == field
    assert field in response.json()["error"]["message"]


def test_runtime_routes_need_the_api_key(engine, adapters, runtime_updates):
    client = app_client(engine, api_key=API_KEY)
    for response in (load(client, "gamma", adapters["gamma"]), unload(client, "gamma")):
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"
    assert model_ids(client, AUTH) == [engine.processor.served_model_name]
    assert load(client, "gamma", adapters["gamma"], AUTH).status_code == 200
    assert unload(client, "gamma", AUTH).status_code == 200


# -- metrics ------------------------------------------------------------------------------------


def lora_info_samples(client: TestClient) -> list:
    text = client.get("/metrics").text
    return [
        sample
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "vllm:lora_requests_info"
    ]


def test_metrics_show_the_adapters_of_the_latest_scheduler_stats(engine, client):
    stats = SchedulerStats(
        num_running=2, num_waiting=1, kv_cache_usage=0.0, prefix_cache_queries=0,
        prefix_cache_hits=0, num_preemptions=0,
        running_lora_adapters={"beta": 1, "alpha": 1}, waiting_lora_adapters={"beta": 1},
    )  # fmt: skip
    for listener in engine.stats_listeners:
        listener(IterationStats(engine_index=0, scheduler_stats=stats))
    (sample,) = lora_info_samples(client)
    assert sample.labels == {
        "model_name": engine.processor.served_model_name,
        "max_lora": "2",
        "running_lora_adapters": "alpha,beta",
        "waiting_lora_adapters": "beta",
    }


def test_metrics_have_no_lora_family_without_enable_lora(model_dir):
    assert lora_info_samples(app_client(make_engine(model_dir))) == []
