"""Hostile input to the server is a 400 naming the field, never a 500: renderer-argument
collisions in chat_template_kwargs, lone surrogates in any text (streaming requests
included, before the stream starts), deep nesting in any JSON field, numbers the engine
cannot carry; nothing logged as an error, and the server serves the next request. Also the
max_tokens defaults, bounded by the context; chat roles core does not read (taken, as
vLLM's); errors that name every bad value, in vLLM's words where vLLM has the same error;
and the bound on the sequences one request may create. Over a real InputProcessor (tiny
checkpoint) and a stand-in engine that records what reaches it."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import httpx
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

MAX_MODEL_LEN = 32
CHAT, COMPLETIONS, TOKENIZE, EMBEDDINGS = (
    "/v1/chat/completions", "/v1/completions", "/tokenize", "/v1/embeddings"
)  # fmt: skip
USER = [{"role": "user", "content": "w1 w2"}]
LONE = "\ud800"  # json.dumps writes it as the escape a client sends: "\ud800"
# What a fix by catching and echoing the exception would let through to the client.
LEAKS = ("codec", "utf-8", "surrogates not allowed", "Recursion", "internal error", "digits")


class RecordingEngine(StandInEngine):
    """What build_app uses of AsyncLLM; `generate` records each prepared request and
    answers one token."""

    def __init__(self, processor: InputProcessor) -> None:
        super().__init__(processor)
        self.prepared: list = []

    async def generate(self, request_id, prepared, priority=0, lora_request=None, cache_salt=None):
        self.prepared.append(prepared)
        sample = CompletionOutput(0, "w7", [VOCAB["w7"]], None, None, finish_reason="length")
        yield RequestOutput(request_id, prepared.prompt, prepared.prompt_token_ids, None,
                            [sample], finished=True)  # fmt: skip


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> RecordingEngine:
    model_dir: Path = write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))
    # The priority policy, so a priority reaches the engine rather than being refused.
    args = EngineArgs(
        model=str(model_dir), max_model_len=MAX_MODEL_LEN, scheduling_policy="priority"
    )
    return RecordingEngine(InputProcessor(EngineSetup.from_engine_args(args, UsageContext.SERVING)))


@pytest.fixture(scope="module")
def client(engine) -> TestClient:
    app = build_app(engine, frontend=FrontendArgs(disable_log_stats=True))
    return TestClient(app, raise_server_exceptions=False)


def post(client: httpx.Client, route: str, body: dict | str) -> httpx.Response:
    """POST a body as JSON text (a str is sent as it is: deep nesting json.dumps cannot write)."""
    text = body if isinstance(body, str) else json.dumps(body)
    return client.post(route, content=text, headers={"content-type": "application/json"})


def nested(levels: int) -> str:
    return "[" * levels + "]" * levels


def chat(**fields) -> dict:
    return {"messages": USER, "max_tokens": 1, **fields}


def completion(**fields) -> dict:
    return {"prompt": "w1 w2", "max_tokens": 1, **fields}


def user_says(content) -> dict:
    return chat(messages=[{"role": "user", "content": content}])


CALL = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def tool(**function) -> dict:
    return {"type": "function", "function": {"name": "f", **function}}


def deep_chat(field_json: str, levels: int = 500) -> str:
    """A chat body whose `field_json` (JSON text with {} where the nesting goes) nests."""
    return json.dumps(chat())[:-1] + ", " + field_json.replace("{}", nested(levels)) + "}"


RESERVED = [
    "messages",
    "chat_template",
    "add_generation_prompt",
    "self",
    "tools",
    "continue_final_message",
]
# Requests that succeed on every route that can, sent after each bad one.
NORMAL = {CHAT: chat(), COMPLETIONS: completion(), TOKENIZE: {"prompt": "w1"}}

CASES = [
    *[(CHAT, chat(chat_template_kwargs={k: 1}), "chat_template_kwargs") for k in RESERVED],
    *[
        (TOKENIZE, {"messages": USER, "chat_template_kwargs": {k: 1}}, "chat_template_kwargs")
        for k in RESERVED
    ],
    # lone surrogates, wherever text goes
    (CHAT, user_says("w1 " + LONE), "messages[0].content"),
    (CHAT, {**user_says(LONE), "stream": True}, "messages[0].content"),
    (CHAT, user_says([{"type": "text", "text": LONE}]), "messages[0].content[0].text"),
    (CHAT, chat(chat_template_kwargs={"x": ["ok", LONE]}), "chat_template_kwargs"),
    (CHAT, chat(chat_template_kwargs={LONE: 1}), "chat_template_kwargs"),
    (
        CHAT,
        chat(tools=[tool(description=LONE)], tool_choice="none"),
        "tools[0].function.description",
    ),
    (COMPLETIONS, completion(prompt=LONE), "prompt"),
    (COMPLETIONS, completion(prompt="w1 \udfff", stream=True), "prompt"),
    (COMPLETIONS, completion(prompt=["w1", LONE]), "prompt"),
    (COMPLETIONS, completion(bad_words=[LONE]), "bad_words"),
    (COMPLETIONS, completion(stop=LONE), "stop"),
    (COMPLETIONS, completion(stop=["w3", LONE], stream=True), "stop"),
    (COMPLETIONS, completion(logit_bias={LONE: 1}), "logit_bias"),
    (COMPLETIONS, completion(guided_regex=LONE), "guided_regex"),
    # constraints that parse but that no text satisfies (empty languages): the message
    # names structured_outputs.<kind>, as for one that does not parse
    (COMPLETIONS, completion(guided_regex="[^\\s\\S]"), None),
    (CHAT, chat(guided_grammar="root ::= root"), None),
    (CHAT, chat(structured_outputs={"regex": "a[^\\s\\S]"}), None),
    (COMPLETIONS, completion(model=LONE), "model"),
    (TOKENIZE, {"prompt": LONE}, "prompt"),
    (TOKENIZE, {"messages": [{"role": "user", "content": LONE}]}, "messages[0].content"),
    (EMBEDDINGS, {"input": ["w1", LONE]}, "input"),
    # 500 levels of nesting in any JSON field
    (CHAT, deep_chat('"chat_template_kwargs": {"x": {}}'), "chat_template_kwargs"),
    (
        TOKENIZE,
        '{"messages": [{"role": "user", "content": "w1"}], "chat_template_kwargs": '
        f'{{"x": {nested(500)}}}}}',
        "chat_template_kwargs",
    ),
    (
        CHAT,
        deep_chat(
            '"tool_choice": "none", "tools": [{"type": "function", "function": '
            '{"name": "f", "parameters": {"x": {}}}}]'
        ),
        "tools[0].function.parameters",
    ),
    (
        CHAT,
        deep_chat(
            '"response_format": {"type": "json_schema", "json_schema": '
            '{"name": "n", "schema": {"x": {}}}}'
        ),
        "response_format.json_schema.schema",
    ),
    (CHAT, deep_chat('"guided_json": {"x": {}}'), "guided_json"),
    (CHAT, chat(guided_json=nested(500)), "guided_json"),  # the schema as JSON text
    (
        CHAT,
        deep_chat(
            '"messages": [{"role": "user", "content": "w1"}, {"role": "assistant", '
            '"tool_calls": [{"id": "c", "function": {"name": "f", "arguments": '
            '{"x": {}}}}]}]'
        ),
        "messages[1].tool_calls[0].function.arguments",
    ),
    # numbers the engine cannot carry
    (COMPLETIONS, completion(top_k=2**64 + 5), "top_k"),
    (COMPLETIONS, completion(priority=2**64), "priority"),
    (COMPLETIONS, completion(logit_bias={"1" * 5000: 1}), "logit_bias"),
    # any role reaches the chat template, but not as an empty or non-text one, and the roles
    # core reads keep their rules
    (CHAT, chat(messages=[{"role": "", "content": "w1"}]), "messages[0].role"),
    (CHAT, chat(messages=[{"role": 7, "content": "w1"}]), "messages[0].role"),
    (CHAT, chat(messages=[{"role": LONE, "content": "w1"}]), "messages[0].role"),
    (CHAT, chat(messages=[{"role": "ipython"}]), "messages[0]"),
    (CHAT, chat(messages=[{"role": "tool", "content": "w1"}]), "messages[0]"),
    (
        CHAT,
        chat(messages=[{"role": "ipython", "content": "w1", "tool_calls": [CALL]}]),
        "messages[0]",
    ),
    (
        CHAT,
        chat(messages=[{"role": "ipython", "content": [{"type": "audio_url", "audio_url": {}}]}]),
        "messages[0].content[0]",
    ),
]


@pytest.mark.parametrize(("route", "body", "param"), CASES)
def test_bad_input_is_a_400_naming_the_field_and_the_server_carries_on(
    client, caplog, route, body, param
):
    caplog.set_level(logging.INFO)
    response = post(client, route, body)
    assert response.status_code == 400, response.text
    assert response.headers["content-type"] == "application/json"  # a stream never started
    error = response.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param)
    assert not any(leak in error["message"] for leak in LEAKS), error["message"]
    assert [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info] == []
    assert [post(client, r, normal).status_code for r, normal in NORMAL.items()] == [200] * 3


@pytest.mark.parametrize(
    "body",
    [
        nested(5000),  # the body itself
        deep_chat('"chat_template_kwargs": {"x": {}}', 5000),
        deep_chat('"an_unknown_field": {}', 5000),
        "{" + '"a": {' * 5000 + "}" * 5001,
    ],
)
def test_json_too_deep_to_parse_is_a_400(client, caplog, body):
    response = post(client, CHAT, body)
    assert response.status_code == 400
    assert [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info] == []
    assert [post(client, r, normal).status_code for r, normal in NORMAL.items()] == [200] * 3


def test_a_valid_surrogate_pair_is_text_like_any_other(client):
    response = post(client, COMPLETIONS, completion(prompt="w1 \U0001f600"))
    assert response.status_code == 200


# --- max_tokens bounded by the context -------------------------------------------------------


def generated_max_tokens(engine, client, route: str, body: dict) -> int:
    assert post(client, route, body).status_code == 200
    return engine.prepared[-1].params.max_tokens


def test_an_omitted_max_tokens_is_the_room_the_prompt_leaves(engine, client):
    # "user : w1 w2 </s> assistant :": 7 tokens of the template.
    assert generated_max_tokens(engine, client, CHAT, {"messages": USER}) == MAX_MODEL_LEN - 7
    prompt = [VOCAB["w1"]] * 20
    body = {"prompt": prompt, "max_tokens": None}
    assert generated_max_tokens(engine, client, COMPLETIONS, body) == MAX_MODEL_LEN - 20
    # Completions' default of 16 is capped to the room as well.
    assert generated_max_tokens(engine, client, COMPLETIONS, {"prompt": prompt}) == 12


@pytest.mark.parametrize(
    ("route", "body", "param"),
    [
        (CHAT, {"messages": USER, "max_tokens": MAX_MODEL_LEN - 6}, "max_tokens"),
        (CHAT, {"messages": USER, "max_completion_tokens": MAX_MODEL_LEN}, "max_completion_tokens"),
        (COMPLETIONS, {"prompt": [VOCAB["w1"]] * 20, "max_tokens": 13}, "max_tokens"),
    ],
)
def test_an_explicit_max_tokens_past_the_context_is_a_400_naming_it(client, route, body, param):
    response = post(client, route, body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param


# --- chat roles -----------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["ipython", "observation", "function_response", "tool_response"])
def test_a_role_core_does_not_read_is_accepted_as_vllm_does(client, role):
    messages = [{"role": role, "content": "w3"}, *USER]
    assert post(client, CHAT, chat(messages=messages)).status_code == 200


def test_a_custom_role_reaches_the_chat_template_as_it_was_sent(engine, client):
    # The template writes "<role>: <content></s>"; a role the vocabulary spells shows up.
    assert post(client, CHAT, chat(messages=[{"role": "w9", "content": "w3"}])).status_code == 200
    assert engine.prepared[-1].prompt_token_ids[:3] == [VOCAB["w9"], VOCAB[":"], VOCAB["w3"]]


# --- errors that name every bad value, and vLLM's words ---------------------------------------


def error_of(client, route: str, body: dict) -> dict:
    response = post(client, route, body)
    assert response.status_code == 400, response.text
    return response.json()["error"]


def test_every_logit_bias_key_that_is_no_token_id_is_named_up_to_five(client):
    bias = {"a": 1, "5": 1, "-1": 1, "1.5": 1}
    error = error_of(client, COMPLETIONS, completion(logit_bias=bias))
    assert error["param"] == "logit_bias"
    assert error["message"] == (
        "logit_bias contains key(s) that cannot be converted to integer token IDs: "
        "['a', '-1', '1.5']"
    )
    many = {f"x{i}": 1 for i in range(12)}
    error = error_of(client, COMPLETIONS, completion(logit_bias=many))
    assert error["message"].endswith(": ['x0', 'x1', 'x2', 'x3', 'x4'] and 7 more")


def test_every_out_of_vocabulary_logit_bias_id_is_named_in_vllm_words(client):
    size = len(VOCAB)
    bias = {"5": 1, str(size): 1, str(size + 7): 1}
    error = error_of(client, CHAT, chat(logit_bias=bias))
    assert error["param"] == "logit_bias"
    assert error["message"] == (
        f"logit_bias: token_id(s) [{size}, {size + 7}] in logit_bias contain out-of-vocab "
        f"token ids. Vocabulary size: {size}"
    )
    many = {str(size + i): 1 for i in range(8)}
    message = error_of(client, COMPLETIONS, completion(logit_bias=many))["message"]
    assert f"[{size}, {size + 1}, {size + 2}, {size + 3}, {size + 4}] and 3 more in" in message


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ([VOCAB["w1"], len(VOCAB) + 3], f"prompt: Token id {len(VOCAB) + 3} is out of vocabulary"),
        ([[VOCAB["w1"]], [len(VOCAB)]], f"prompt: Token id {len(VOCAB)} is out of vocabulary"),
        ("", "prompt: The decoder prompt cannot be empty"),
    ],
)
def test_prompt_errors_are_in_vllm_words(client, prompt, message):
    error = error_of(client, COMPLETIONS, completion(prompt=prompt))
    assert (error["param"], error["message"]) == ("prompt", message)


# --- what one request may create --------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("body", "param"),
    [
        # 2.4 KB that would queue 51,200 sequences
        (completion(prompt=["w1"] * 400, n=128), "n"),
        (completion(prompt=["w1"] * 1025), "prompt"),
        (completion(prompt=[[VOCAB["w1"]]] * 1025, n=2), "prompt"),
    ],
)
def test_a_request_past_the_sequence_limit_is_refused_before_the_engine(
    engine, client, body, param, stream
):
    reached = len(engine.prepared)
    error = error_of(client, COMPLETIONS, {**body, "stream": stream})
    assert error["param"] == param
    assert "--max-sequences-per-request" in error["message"]
    assert len(engine.prepared) == reached


def test_the_sequence_limit_counts_prompts_times_n_up_to_the_flag(engine):
    frontend = FrontendArgs(disable_log_stats=True, max_sequences_per_request=4)
    client = TestClient(build_app(engine, frontend=frontend), raise_server_exceptions=False)
    assert post(client, CHAT, chat(n=4)).status_code == 200
    assert post(client, COMPLETIONS, completion(prompt=["w1", "w2"], n=2)).status_code == 200
    reached = len(engine.prepared)
    assert error_of(client, CHAT, chat(n=5))["message"] == (
        "n is 5, more than the 4 sequences one request may create (--max-sequences-per-request)"
    )
    assert error_of(client, COMPLETIONS, completion(prompt=["w1"] * 3, n=2))["message"] == (
        "n is 2 for each of 3 prompts (6), more than the 4 sequences one request may "
        "create (--max-sequences-per-request)"
    )
    error = error_of(client, COMPLETIONS, completion(prompt=["w1"] * 5))
    assert (error["param"], error["message"]) == (
        "prompt",
        "prompt holds 5 prompts, more than the 4 sequences one request may create "
        "(--max-sequences-per-request)",
    )
    assert len(engine.prepared) == reached


# --- the real server ------------------------------------------------------------------------


@pytest.mark.slow
def test_the_real_server_answers_the_worst_inputs_with_400s_and_stays_healthy(default_server):
    server = default_server
    logged_before = server.log.stat().st_size  # the server is shared: read only this test's lines
    worst = [
        (CHAT, chat(chat_template_kwargs={"self": 1}), "chat_template_kwargs"),
        (CHAT, {**user_says("hi " + LONE), "stream": True}, "messages[0].content"),
        (COMPLETIONS, completion(stop=[LONE]), "stop"),
        (CHAT, deep_chat('"chat_template_kwargs": {"x": {}}'), "chat_template_kwargs"),
        (CHAT, deep_chat('"chat_template_kwargs": {"x": {}}', 5000), None),
        (COMPLETIONS, completion(prompt=["Hi"] * 400, n=128), "n"),  # 51,200 sequences
    ]
    with httpx.Client(base_url=server.url, timeout=60) as http:
        for route, body, param in worst:
            response = post(http, route, body)
            assert response.status_code == 400, response.text
            assert response.json()["error"]["param"] == param
        assert http.get("/health").status_code == 200
        assert http.post(COMPLETIONS, json={"prompt": "Hi", "max_tokens": 2}).status_code == 200
        ipython = chat(messages=[{"role": "ipython", "content": "42"}, *USER], max_tokens=2)
        assert http.post(CHAT, json=ipython).status_code == 200
    assert b"Traceback" not in server.log.read_bytes()[logged_before:]
