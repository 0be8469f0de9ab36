"""Tool calling through the official openai client.

Canned outputs: the app is built over a real InputProcessor (the default model's tokenizer,
with tests/data/tool_chat_template_hermes.jinja as its chat template) and a scripted
engine that answers each request with text written here, streamed a few characters at a
time. So each parser, and the "required" / named choices, are driven through the whole
HTTP path: a call, the tool's result sent back, the final answer, whole and streamed.
The default model itself under tool_choice="required": a real `core serve` (slow).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jsonschema
import openai
import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient
from server_process import ServerProcess
from stand_in_engine import StandInEngine

from core.config import UsageContext
from core.engine.processor import EngineSetup, InputProcessor
from core.engine_args import EngineArgs
from core.entrypoints.cli import cli
from core.entrypoints.openai.api_server import build_app
from core.entrypoints.openai.frontend_args import FrontendArgs
from core.entrypoints.openai.tool_calls import ToolCalling
from core.outputs import CompletionOutput, RequestOutput
from core.tool_parsers import tool_parser_class

MODEL = "SmolLM2-135M-Instruct"
TEMPLATE = Path(__file__).parents[2] / "data" / "tool_chat_template_hermes.jinja"
WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 32},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
}
TIME_PARAMETERS = {
    "type": "object",
    "properties": {"zone": {"type": "string", "enum": ["UTC", "CET", "PST"]}},
    "required": ["zone"],
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": WEATHER_PARAMETERS,
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": TIME_PARAMETERS}}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
ARGUMENTS = {"city": "Paris", "unit": "celsius"}
TOOL_RESULT = "21 degrees, sunny"
ANSWER = "It is 21 degrees and sunny in Paris."

# How each parser's models write the call get_weather(city="Paris", unit="celsius").
CALL_TEXT = {
    "hermes": (
        "<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
        "</tool_call>"
    ),
    "llama3_json": (
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}'
    ),
    "mistral": (
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}]'
    ),
    "pythonic": "[get_weather(city='Paris', unit='celsius')]",
}


class ScriptedEngine(StandInEngine):
    """What build_app uses of AsyncLLM: a real processor; `generate` records the request
    and answers with the next text of `script`, in pieces of 4 characters."""

    def __init__(self, processor: InputProcessor) -> None:
        super().__init__(processor)
        self.script: list[str] = []
        self.finish_reason = "stop"  # of each scripted answer
        self.requests: list = []  # the PreparedRequests received

    async def generate(self, request_id, prepared, **_options):
        self.requests.append(prepared)
        text = self.script.pop(0)
        pieces = [text[i : i + 4] for i in range(0, len(text), 4)]
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1
            reason = self.finish_reason if last else None
            sample = CompletionOutput(0, piece, [i], None, None, reason)
            yield RequestOutput(request_id, prepared.prompt, prepared.prompt_token_ids, None,
                                [sample], finished=last)  # fmt: skip

    def last_prompt(self) -> str:
        return self.tokenizer.decode(self.requests[-1].prompt_token_ids)


@pytest.fixture(scope="module")
def engine() -> ScriptedEngine:
    args = EngineArgs(chat_template=str(TEMPLATE), max_model_len=2048)
    return ScriptedEngine(InputProcessor(EngineSetup.from_engine_args(args, UsageContext.SERVING)))


def api_for(
    engine: ScriptedEngine,
    tool_calling: ToolCalling = ToolCalling(),
    frontend: FrontendArgs = FrontendArgs(),
) -> openai.OpenAI:
    app = build_app(engine, frontend=frontend, tool_calling=tool_calling)
    http = TestClient(app, raise_server_exceptions=False)
    return openai.OpenAI(
        base_url="http://testserver/v1", api_key="unused", http_client=http, max_retries=0
    )


def auto_api(engine: ScriptedEngine, parser: str) -> openai.OpenAI:
    return api_for(engine, ToolCalling(tool_parser_class(parser), enable_auto_tool_choice=True))


def ask(api: openai.OpenAI, messages: list, stream: bool, **kwargs):
    """(content, [(id, name, arguments)], finish_reason) of one chat completion, the
    streamed one put back together as an OpenAI client would."""
    kwargs = {"model": MODEL, "messages": messages, "tools": [WEATHER, TIME], **kwargs}
    if not stream:
        choice = api.chat.completions.create(**kwargs).choices[0]
        calls = choice.message.tool_calls or []
        found = [(c.id, c.function.name, c.function.arguments) for c in calls]
        return choice.message.content, found, choice.finish_reason
    content, calls, finish_reason = "", {}, None
    for chunk in api.chat.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for call in choice.delta.tool_calls or []:
                if call.index not in calls:  # a call's first piece names it
                    assert call.id and call.type == "function" and call.function.name
                    calls[call.index] = [call.id, call.function.name, ""]
                else:
                    assert call.id is None and call.function.name is None
                calls[call.index][2] += call.function.arguments or ""
            finish_reason = choice.finish_reason or finish_reason
    return content or None, [tuple(c) for c in calls.values()], finish_reason


def round_trip(
    engine: ScriptedEngine, api: openai.OpenAI, call_text: str, stream: bool, tool_choice=None
) -> str:
    """A call, the tool's result sent back, the final answer (with tool_choice "none" when
    the call was forced); checks all three and returns the call's finish reason."""
    engine.script = [call_text, ANSWER]
    forced = {} if tool_choice is None else {"tool_choice": tool_choice}
    content, calls, finish_reason = ask(api, QUESTION, stream, **forced)
    ((call_id, name, arguments),) = calls
    assert (content, name, json.loads(arguments)) == (None, "get_weather", ARGUMENTS)
    offered = '<tools>\n{"type": "function", "function": {"name": "get_weather"'
    assert offered in engine.last_prompt()
    history = QUESTION + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": TOOL_RESULT},
    ]
    after = {} if tool_choice is None else {"tool_choice": "none"}
    assert ask(api, history, stream, **after) == (ANSWER, [], "stop")
    prompt = engine.last_prompt()
    sent_back = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
    assert f"<tool_call>\n{sent_back}\n</tool_call>" in prompt
    assert f"<tool_response>\n{TOOL_RESULT}\n</tool_response>" in prompt
    return finish_reason


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("parser", sorted(CALL_TEXT))
def test_auto_round_trip_with_each_parser(engine, parser, stream):
    finish_reason = round_trip(engine, auto_api(engine, parser), CALL_TEXT[parser], stream)
    assert finish_reason == "tool_calls"
    # Markup made of special tokens must survive detokenization for the parser to see it.
    keeps = parser != "pythonic"
    assert engine.requests[-2].params.skip_special_tokens is not keeps


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_required_choice_round_trip_under_its_schema(engine, stream):
    output = '[{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}]'
    finish_reason = round_trip(engine, api_for(engine), output, stream, "required")
    assert finish_reason == "tool_calls"
    schema = engine.requests[-2].params.structured_outputs.json
    jsonschema.validate(json.loads(output), schema)
    rejected = [
        [],  # no call
        [{"name": "get_weather", "parameters": {"city": "Paris"}}],  # arguments invalid
        [{"name": "get_news", "parameters": {}}],  # not a tool
    ]
    for bad in rejected:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_tools_with_pydantic_definitions_are_constrained_by_their_schemas(engine):
    """Pydantic writes nested models as $defs with "$ref": "#/$defs/Name"; two tools may use
    the same name for different definitions. Under "required" the calls' schema holds both
    tools' definitions apart, and every reference still resolves (and compiles)."""
    import pydantic

    class Address(pydantic.BaseModel):
        city: str

    class Ship(pydantic.BaseModel):
        to: Address
        back: Address | None = None

    class Address2(pydantic.BaseModel):  # the same $defs name, another shape
        zone: int

    visit = Address2.model_json_schema()
    visit["title"] = "Visit"
    tree = {"type": "object", "properties": {"v": {"type": "integer"},
            "kids": {"type": "array", "items": {"$ref": "#"}}}, "required": ["v"]}  # fmt: skip
    ship_schema = Ship.model_json_schema()
    wrapped = {"type": "object", "properties": {"at": {"$ref": "#/$defs/Address"}},
               "required": ["at"], "$defs": {"Address": Address2.model_json_schema()}}  # fmt: skip
    tools = [function("ship", ship_schema), function("visit", wrapped), function("tree", tree)]
    output = (
        '[{"name": "ship", "parameters": {"to": {"city": "Oslo"}}}, '
        '{"name": "visit", "parameters": {"at": {"zone": 3}}}, '
        '{"name": "tree", "parameters": {"v": 1, "kids": [{"v": 2, "kids": []}]}}]'
    )
    engine.script = [output]
    kwargs = {"tools": tools, "tool_choice": "required"}
    content, calls, _ = ask(api_for(engine), QUESTION, False, **kwargs)
    assert [name for _, name, _ in calls] == ["ship", "visit", "tree"]
    schema = engine.requests[-1].params.structured_outputs.json
    jsonschema.validate(json.loads(output), schema)
    rejected = [
        [{"name": "ship", "parameters": {"to": {"zone": 3}}}],  # ship's Address has a city
        [{"name": "visit", "parameters": {"at": {"city": "Oslo"}}}],  # visit's has a zone
        [{"name": "tree", "parameters": {"v": 1, "kids": [{"kids": []}]}}],  # a kid without v
    ]
    for bad in rejected:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    named = {"type": "function", "function": {"name": "ship"}}
    engine.script = ['{"to": {"city": "Oslo"}}']
    _, ((_, name, arguments),), _ = ask(api_for(engine), QUESTION, False, tools=tools,
                                        tool_choice=named)  # fmt: skip
    assert (name, json.loads(arguments)) == ("ship", {"to": {"city": "Oslo"}})


@pytest.mark.parametrize(
    ("choice", "cut_off"),
    [
        ({"type": "function", "function": {"name": "get_weather"}}, '{"city": "Par'),
        ("required", '[{"name": "get_weather", "parameters": {"city": "Par'),
    ],
    ids=["named", "required"],
)
def test_a_call_cut_off_by_max_tokens_is_no_call(engine, choice, cut_off):
    """The arguments are not whole JSON: no tool call, finish_reason "length", and the text
    kept as the content (as vLLM answers)."""
    engine.script, engine.finish_reason = [cut_off], "length"
    try:
        content, calls, finish_reason = ask(api_for(engine), QUESTION, False, tool_choice=choice)
    finally:
        engine.finish_reason = "stop"
    assert (content, calls, finish_reason) == (cut_off, [], "length")


def test_required_choice_without_parallel_calls_allows_one_call(engine):
    engine.script = ['[{"name": "get_time", "parameters": {"zone": "UTC"}}]']
    ask(api_for(engine), QUESTION, False, tool_choice="required", parallel_tool_calls=False)
    schema = engine.requests[-1].params.structured_outputs.json
    call = {"name": "get_time", "parameters": {"zone": "UTC"}}
    jsonschema.validate([call], schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([call, call], schema)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_named_choice_round_trip_under_the_functions_schema(engine, stream):
    named = {"type": "function", "function": {"name": "get_weather"}}
    output = ' {"city": "Paris", "unit": "celsius"}\n'
    finish_reason = round_trip(engine, api_for(engine), output, stream, named)
    assert finish_reason == "stop"  # as OpenAI answers a named choice
    assert engine.requests[-2].params.structured_outputs.json == WEATHER_PARAMETERS


def test_choice_none_leaves_the_output_as_text(engine):
    engine.script = [CALL_TEXT["hermes"]]
    api = auto_api(engine, "hermes")
    assert ask(api, QUESTION, False, tool_choice="none") == (CALL_TEXT["hermes"], [], "stop")
    assert engine.requests[-1].params.structured_outputs is None


def test_plain_answer_with_tools_offered_is_content(engine):
    engine.script = [ANSWER]
    assert ask(auto_api(engine, "hermes"), QUESTION, True) == (ANSWER, [], "stop")


def test_chat_template_kwargs_cannot_override_the_tools(engine):
    kwargs = {"tools": [], "add_generation_prompt": False}
    api = auto_api(engine, "hermes")
    with pytest.raises(openai.BadRequestError) as error:
        ask(api, QUESTION, False, extra_body={"chat_template_kwargs": kwargs})
    assert error.value.body["param"] == "chat_template_kwargs"
    assert "cannot set add_generation_prompt, tools" in error.value.body["message"]


# --- refused requests ----------------------------------------------------------------------


def bad_request(api: openai.OpenAI, **kwargs) -> openai.BadRequestError:
    with pytest.raises(openai.BadRequestError) as error:
        api.chat.completions.create(**{"model": MODEL, "messages": QUESTION, **kwargs})
    return error.value


def test_auto_choice_needs_the_server_flags(engine):
    error = bad_request(api_for(engine), tools=[WEATHER])
    assert error.body["param"] == "tool_choice"
    assert "--enable-auto-tool-choice" in error.body["message"]


def test_tools_with_a_template_that_ignores_them_are_refused(engine):
    template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    api = api_for(engine, frontend=FrontendArgs(trust_request_chat_template=True))
    body = {"chat_template": template}
    error = bad_request(api, tools=[WEATHER], tool_choice="required", extra_body=body)
    assert error.body["param"] == "tools"


def function(name: str, parameters=None) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


@pytest.mark.parametrize(
    ("tools", "param"),
    [
        ([function("get weather")], "tools[0].function.name"),
        ([WEATHER, WEATHER], "tools[1].function.name"),
        ([function("f", {"type": "string"})], "tools[0].function.parameters"),
        ([function("f", {"type": "object", "required": 3})], "tools[0].function.parameters"),
        ([function("f", [])], "tools[0].function.parameters"),
    ],
)
def test_malformed_tools_are_a_400_naming_the_field(engine, tools, param):
    assert bad_request(api_for(engine), tools=tools, tool_choice="none").body["param"] == param


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"tool_choice": {"type": "function", "function": {"name": "get_news"}}}, "tool_choice"),
        ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
    ],
)
def test_tool_choice_that_cannot_be_honoured_is_a_400(engine, kwargs, param):
    assert bad_request(api_for(engine), tools=[WEATHER], **kwargs).body["param"] == param


def test_tool_choice_without_tools_is_a_400(engine):
    assert bad_request(api_for(engine), tool_choice="required").body["param"] == "tool_choice"


def test_tool_message_needs_its_call_id(engine):
    messages = QUESTION + [{"role": "tool", "content": TOOL_RESULT}]
    error = bad_request(api_for(engine), messages=messages)
    assert "tool_call_id is required" in error.body["message"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--tool-call-parser", "nope"], "--tool-call-parser: tool parser 'nope' is not installed"),
        (["--enable-auto-tool-choice"], "--enable-auto-tool-choice needs --tool-call-parser"),
    ],
)
def test_serve_refuses_bad_tool_flags_before_starting(flags, message):
    result = CliRunner().invoke(cli, ["serve", *flags])
    assert result.exit_code != 0 and message in result.output


# --- the default model ---------------------------------------------------------------------


@pytest.mark.slow
def test_default_model_required_calls_parse_and_validate_over_20_seeds():
    """20 seeds whole and 4 streamed, sent at once; one call each (parallel_tool_calls
    false: the schema then bounds the output, so max_tokens cannot cut a call short)."""
    streams = [False] * 20 + [True] * 4
    kwargs = {"tool_choice": "required", "parallel_tool_calls": False, "max_tokens": 256}
    server = ServerProcess("--chat-template", str(TEMPLATE)).wait_ready()
    try:
        api = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        with ThreadPoolExecutor(len(streams)) as pool:
            answers = list(
                pool.map(
                    lambda seed: ask(api, QUESTION, streams[seed], seed=seed, **kwargs),
                    range(len(streams)),
                )
            )
    finally:
        server.stop()
    schemas = {"get_weather": WEATHER_PARAMETERS, "get_time": TIME_PARAMETERS}
    for seed, (content, calls, finish_reason) in enumerate(answers):
        assert (content, finish_reason, len(calls)) == (None, "tool_calls", 1), seed
        ((_, name, arguments),) = calls
        jsonschema.validate(json.loads(arguments), schemas[name])
