"""Every field of a request is honoured or refused (request_fields): a field of vLLM's or
OpenAI's protocol that core does not implement is a 400 naming it unless sent with its "off"
value, a field nobody knows is ignored with vLLM's warning, and the policy holds for every
request model, future ones included. Over a real InputProcessor (tiny checkpoint) and a
stand-in engine that records what reaches it."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError
from stand_in_engine import StandInEngine
from tiny_engine_checkpoint import VOCAB, write_tiny_checkpoint

from core.config import UsageContext
from core.engine.processor import EngineSetup, InputProcessor
from core.engine_args import EngineArgs
from core.entrypoints.openai.api_server import build_app
from core.entrypoints.openai.frontend_args import FrontendArgs
from core.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest, _Request
from core.entrypoints.openai.request_fields import (
    CHAT_UNSUPPORTED,
    COMPLETION_UNSUPPORTED,
    Unsupported,
)
from core.outputs import CompletionOutput, RequestOutput

CHAT = [{"role": "user", "content": "w4 w5"}]
IGNORED = "The following fields were present in the request but ignored"


def completion(**fields) -> CompletionRequest:
    return CompletionRequest.model_validate({"prompt": "w1", **fields})


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": CHAT, **fields})


def refused_at(build, **fields) -> tuple:
    with pytest.raises(ValidationError) as exc:
        build(**fields)
    (error,) = exc.value.errors()
    return error["loc"]


@pytest.mark.parametrize(
    ("build", "field", "value"),
    [
        (completion, "best_of", 2),
        (completion, "best_of", True),  # not the 1 that means one candidate
        (completion, "truncate_prompt_tokens", 8),
        (completion, "logits_processors", ["my.Processor"]),
        (completion, "add_special_tokens", False),
        (completion, "prompt_embeds", "AAAA"),
        (completion, "request_id", "mine"),
        (chat, "add_special_tokens", True),
        (chat, "documents", [{"title": "t", "text": "x"}]),
        (chat, "store", True),
        (chat, "modalities", ["text", "audio"]),
        (chat, "service_tier", "flex"),
        (chat, "echo", True),
    ],
)
def test_a_known_field_core_does_not_implement_is_refused_at_the_field(build, field, value):
    assert refused_at(build, **{field: value}) == (field,)


@pytest.mark.parametrize(
    ("build", "fields"),
    [
        (completion, {"best_of": None, "add_special_tokens": True, "logits_processors": None}),
        (completion, {"best_of": 1, "stream_interval": 1, "guided_decoding_backend": "xgrammar"}),
        (chat, {"add_special_tokens": False, "store": False, "service_tier": "auto"}),
        (chat, {"modalities": ["text"], "include_reasoning": True, "echo": False}),
    ],
)
def test_the_same_fields_asking_for_nothing_are_accepted_without_a_warning(build, fields, caplog):
    build(**fields)
    assert not any(IGNORED in message for message in caplog.messages)


@pytest.mark.parametrize(
    ("build", "table"),
    [(completion, COMPLETION_UNSUPPORTED), (chat, CHAT_UNSUPPORTED)],
)
def test_every_declared_field_is_refused_when_it_asks_for_something(build, table):
    for name in table:
        assert refused_at(build, **{name: "something"}) == (name,), name


def test_stream_options_refuse_what_they_do_not_implement():
    fields = {"stream": True, "stream_options": {"include_obfuscation": True}}
    assert refused_at(completion, **fields) == ("stream_options", "include_obfuscation")


def test_an_unknown_field_is_ignored_with_vllms_warning_naming_it(caplog):
    caplog.set_level(logging.WARNING)
    req = completion(frobnicate=1, max_tokens=3)
    assert req.max_tokens == 3 and not hasattr(req, "frobnicate")
    assert f"{IGNORED}: {{'frobnicate'}}" in caplog.messages


def test_every_request_model_follows_the_policy_and_an_implemented_field_wins(caplog):
    class Future(_Request):  # a request model written later
        unsupported_fields = {"later": Unsupported("not yet"), "done": Unsupported("not yet")}
        done: int = 0

    with pytest.raises(ValidationError, match="later 1 is not supported: not yet"):
        Future.model_validate({"later": 1})
    assert Future.model_validate({"done": 3, "later": None, "other": 1}).done == 3
    assert f"{IGNORED}: {{'other'}}" in caplog.messages


class RecordingEngine(StandInEngine):
    """`generate` records the SamplingParams that reach it and answers two deltas of one
    token each."""

    def __init__(self, processor: InputProcessor) -> None:
        super().__init__(processor)
        self.params: list = []

    async def generate(self, request_id, prepared, priority=0, lora_request=None, cache_salt=None):
        self.params.append(prepared.params)
        for i, word in enumerate(("w7", "w8")):
            sample = CompletionOutput(
                0, word, [VOCAB[word]], None, None, finish_reason="length" if i else None
            )
            yield RequestOutput(
                request_id, prepared.prompt, prepared.prompt_token_ids, None, [sample], bool(i)
            )


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def served(model_dir) -> tuple[RecordingEngine, TestClient]:
    args = EngineArgs(
        model=str(model_dir),
        max_model_len=32,
        logits_processors=["core.sample.logit_softcap:SoftcapLogitsProcessor"],
    )
    setup = EngineSetup.from_engine_args(args, UsageContext.SERVING)
    engine = RecordingEngine(InputProcessor(setup))
    app = build_app(engine, frontend=FrontendArgs(disable_log_stats=True))
    return engine, TestClient(app, raise_server_exceptions=False)


@pytest.mark.parametrize(
    ("route", "body", "param", "says"),
    [
        ("/v1/completions", {"best_of": 3}, "best_of", "best_of 3 is not supported: best-of"),
        ("/v1/chat/completions", {"echo": True}, "echo", "chat does not echo"),
        (
            "/v1/completions",
            {"vllm_xargs": {"logit_softcap": -1}},
            "vllm_xargs",
            "refused by logits processor SoftcapLogitsProcessor: logit_softcap must be",
        ),
        (
            "/v1/chat/completions",
            {"vllm_xargs": {"kv_transfer_params": "x"}},
            "vllm_xargs",
            "send the kv_transfer_params field",
        ),
    ],
)
def test_a_refused_field_is_a_400_naming_it_and_nothing_reaches_the_engine(
    served, route, body, param, says
):
    engine, client = served
    before = len(engine.params)
    response = client.post(route, json={"prompt": "w1", "messages": CHAT, **body})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param and says in error["message"]
    assert len(engine.params) == before


def test_vllm_xargs_reach_the_engine_as_extra_args(served):
    engine, client = served
    xargs = {"logit_softcap": 30, "tag": "a", "ids": [1, 2]}
    body = {"prompt": "w1", "max_tokens": 2, "vllm_xargs": xargs, "kv_transfer_params": None}
    assert client.post("/v1/completions", json=body).status_code == 200
    assert engine.params[-1].extra_args == xargs


def test_continuous_usage_stats_put_the_usage_so_far_on_every_chunk(served):
    _, client = served
    body = {"messages": CHAT, "max_tokens": 2, "stream": True,
            "stream_options": {"continuous_usage_stats": True}}  # fmt: skip
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        lines = [line[6:] for line in response.iter_lines() if line.startswith("data: {")]
    usages = [json.loads(line)["usage"] for line in lines]
    assert [u["completion_tokens"] for u in usages] == [1, 2]
    assert len({u["prompt_tokens"] for u in usages}) == 1
