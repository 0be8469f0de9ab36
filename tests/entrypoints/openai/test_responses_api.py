"""The Responses API (/v1/responses) through the official openai client, over a scripted
engine: a real InputProcessor (the default model's tokenizer, with
tests/data/tool_chat_template_hermes.jinja as its chat template) whose engine answers each
request with text written here, a few characters at a time. So the request's conversation
(seen in the prompt the engine gets), the output items, the stream's events, the store and
cancellation are checked exactly, without a model. The default model itself: see
test_responses_server.py; a reasoning model's: tests/reasoning/test_reasoning_server.py.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import openai
import pytest
from fastapi.testclient import TestClient
from reasoning_checkpoint import reasoning_tokenizer
from stand_in_engine import StandInEngine

from core.config import UsageContext
from core.engine.processor import EngineSetup, InputProcessor
from core.engine_args import EngineArgs
from core.entrypoints.openai.api_server import build_app
from core.entrypoints.openai.tool_calls import ToolCalling
from core.outputs import CompletionOutput, RequestOutput
from core.reasoning import build_reasoning_parser
from core.tool_parsers import tool_parser_class

TEMPLATE = Path(__file__).parents[2] / "data" / "tool_chat_template_hermes.jinja"
WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 32},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
}
WEATHER = {"type": "function", "name": "get_weather", "parameters": WEATHER_PARAMETERS}
CALL_TEXT = '[{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}]'
ARGUMENTS = {"city": "Paris", "unit": "celsius"}
HANG = object()  # a script entry: one piece, then nothing until the request is aborted
ENCRYPTED_REASONING = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "x"}


class ScriptedEngine(StandInEngine):
    """`generate` answers with the next entry of `script`: a text, in pieces of 4
    characters of one token (id 0) each, or a list of (text, token ids) pieces; the last
    piece finishes with `finish_reason`. An exception entry is raised. It records each
    request's prompt, and the ids of the requests closed before their end (what AsyncLLM
    aborts in the engine core)."""

    def __init__(self, processor: InputProcessor) -> None:
        super().__init__(processor)
        self.script: list = []
        self.finish_reason = "stop"
        self.prompts: list[str] = []
        self.params: list = []  # the SamplingParams received
        self.aborted: list[str] = []

    async def generate(self, request_id, prepared, **_options):
        self.prompts.append(self.tokenizer.decode(prepared.prompt_token_ids))
        self.params.append(prepared.params)
        entry = self.script.pop(0)
        if isinstance(entry, Exception):
            raise entry
        finished = False
        try:
            if entry is HANG:
                yield _output(request_id, prepared, ("Once", [0] * 4), None)
                await asyncio.Event().wait()
            pieces = _pieces(entry)
            for i, piece in enumerate(pieces):
                finished = i == len(pieces) - 1
                yield _output(request_id, prepared, piece, self.finish_reason if finished else None)
        finally:
            if not finished:
                self.aborted.append(request_id)


def _pieces(entry: str | list[tuple[str, list[int]]]) -> list[tuple[str, list[int]]]:
    if not isinstance(entry, str):
        return entry
    return [(entry[i : i + 4], [0] * len(entry[i : i + 4])) for i in range(0, len(entry), 4)]


def _output(request_id, prepared, piece, finish_reason) -> RequestOutput:
    text, token_ids = piece
    sample = CompletionOutput(0, text, token_ids, None, None, finish_reason)
    return RequestOutput(
        request_id, prepared.prompt, prepared.prompt_token_ids, None, [sample],
        finished=finish_reason is not None,
    )  # fmt: skip


@pytest.fixture(scope="module")
def engine() -> ScriptedEngine:
    args = EngineArgs(chat_template=str(TEMPLATE), max_model_len=2048)
    return ScriptedEngine(InputProcessor(EngineSetup.from_engine_args(args, UsageContext.SERVING)))


@pytest.fixture(scope="module")
def api(engine):
    # One TestClient session: one event loop, where background responses run between calls.
    with TestClient(build_app(engine), raise_server_exceptions=False) as http:
        yield openai.OpenAI(
            base_url="http://testserver/v1", api_key="unused", http_client=http, max_retries=0
        )


@pytest.fixture(scope="module")
def hermes_api(engine):
    """A server reading calls out of the text with the hermes parser (tool_choice auto)."""
    tool_calling = ToolCalling(tool_parser_class("hermes"), enable_auto_tool_choice=True)
    with TestClient(build_app(engine, tool_calling=tool_calling)) as http:
        yield openai.OpenAI(
            base_url="http://testserver/v1", api_key="unused", http_client=http, max_retries=0
        )


@pytest.fixture(autouse=True)
def fresh_script(engine):
    engine.script, engine.finish_reason = [], "stop"


def test_text_answer_is_one_message_item_with_usage(engine, api):
    engine.script = ["Hello, Ada."]
    response = api.responses.create(
        input="Hi, I am Ada.", instructions="Be brief.", metadata={"k": "v"}, user="ada"
    )
    assert (response.metadata, response.user, response.store) == ({"k": "v"}, "ada", True)
    assert response.id.startswith("resp_") and response.object == "response"
    assert (response.status, response.output_text, response.instructions) == (
        "completed",
        "Hello, Ada.",
        "Be brief.",
    )
    (message,) = response.output
    assert (message.type, message.role, message.status) == ("message", "assistant", "completed")
    assert [(part.type, part.annotations) for part in message.content] == [("output_text", [])]
    prompt_ids = engine.tokenizer.encode(engine.prompts[-1], add_special_tokens=False)
    assert response.usage.input_tokens == len(prompt_ids)
    assert response.usage.output_tokens == len("Hello, Ada.")  # the script's token per char
    assert response.usage.total_tokens == response.usage.input_tokens + len("Hello, Ada.")
    assert engine.prompts[-1] == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi, I am Ada.<|im_end|>\n<|im_start|>assistant\n"
    )


def test_message_items_become_the_conversation(engine, api):
    engine.script = ["Fine."]
    api.responses.create(
        input=[
            {"role": "developer", "content": "Answer in one word."},
            {"role": "user", "content": [{"type": "input_text", "text": "How are you?"}]},
            {"type": "message", "role": "assistant", "content": "Well."},
            {"role": "user", "content": "And now?"},
        ]
    )
    assert engine.prompts[-1] == (
        "<|im_start|>system\nAnswer in one word.<|im_end|>\n"
        "<|im_start|>user\nHow are you?<|im_end|>\n<|im_start|>assistant\nWell.<|im_end|>\n"
        "<|im_start|>user\nAnd now?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_stream_events_come_in_order_and_add_up_to_the_response(engine, api):
    engine.script = ["Streamed, piece by piece."]
    events = list(api.responses.create(input="Hi", stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * len(deltas),
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    final = events[-1].response
    assert "".join(deltas) == events[-4].text == final.output_text == "Streamed, piece by piece."
    item_ids = {e.item_id for e in events if hasattr(e, "item_id")}
    assert item_ids == {final.output[0].id} == {events[2].item.id}
    assert api.responses.retrieve(final.id).output_text == final.output_text


@pytest.mark.parametrize(
    ("text_format", "constraint"),
    [
        ({"type": "json_object"}, {"json_object": True}),
        (
            {"type": "json_schema", "name": "weather", "schema": WEATHER_PARAMETERS},
            {"json": WEATHER_PARAMETERS},
        ),
    ],
    ids=["json_object", "json_schema"],
)
def test_text_format_constrains_the_output(engine, api, text_format, constraint):
    engine.script = ['{"city": "Paris", "unit": "celsius"}']
    response = api.responses.create(input="Weather?", text={"format": text_format})
    structured = engine.params[-1].structured_outputs
    assert {k: getattr(structured, k) for k in constraint} == constraint
    assert response.text.format.type == text_format["type"]


def test_sampling_settings_reach_the_engine_and_are_echoed(engine, api):
    engine.script = ["Sure."]
    response = api.responses.create(input="Hi", temperature=0.5, top_p=0.75, max_output_tokens=7)
    params = engine.params[-1]
    assert (params.temperature, params.top_p, params.max_tokens) == (0.5, 0.75, 7)
    assert (response.temperature, response.top_p, response.max_output_tokens) == (0.5, 0.75, 7)


def test_max_output_tokens_reached_is_incomplete(engine, api):
    engine.script, engine.finish_reason = ["Once upon"], "length"
    response = api.responses.create(input="A story", max_output_tokens=9)
    assert (response.status, response.incomplete_details.reason) == (
        "incomplete",
        "max_output_tokens",
    )
    assert (response.max_output_tokens, response.output[0].status) == (9, "incomplete")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_required_tool_choice_gives_a_function_call_item(engine, api, stream):
    engine.script = [CALL_TEXT]
    kwargs = {"input": "Weather in Paris?", "tools": [WEATHER], "tool_choice": "required"}
    if not stream:
        response = api.responses.create(**kwargs)
    else:
        events = list(api.responses.create(stream=True, **kwargs))
        fragments = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
        (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
        assert "".join(fragments) == done.arguments
        response = events[-1].response
    (call,) = response.output
    assert (call.type, call.name, call.status) == ("function_call", "get_weather", "completed")
    assert call.call_id.startswith("call_") and json.loads(call.arguments) == ARGUMENTS
    assert response.tools[0].name == "get_weather" and response.tool_choice == "required"
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in engine.prompts[-1]


def test_text_then_a_call_are_two_items_streamed_one_after_the_other(engine, hermes_api):
    call = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
    engine.script = [f"Let me check.\n<tool_call>\n{call}\n</tool_call>"]
    events = list(hermes_api.responses.create(input="Weather?", tools=[WEATHER], stream=True))
    items = [(e.type, e.output_index) for e in events if e.type.startswith("response.output_item")]
    assert items == [
        ("response.output_item.added", 0),
        ("response.output_item.done", 0),
        ("response.output_item.added", 1),
        ("response.output_item.done", 1),
    ]
    message, function_call = events[-1].response.output
    assert message.content[0].text.strip() == "Let me check."
    assert (function_call.name, json.loads(function_call.arguments)) == ("get_weather", ARGUMENTS)


def test_a_tool_result_continues_the_previous_response(engine, api):
    engine.script = [CALL_TEXT, "It is sunny in Paris."]
    first = api.responses.create(input="Weather in Paris?", tools=[WEATHER], tool_choice="required")
    result = {"type": "function_call_output", "call_id": first.output[0].call_id, "output": "sun"}
    second = api.responses.create(input=[result], previous_response_id=first.id)
    assert (second.output_text, second.previous_response_id) == ("It is sunny in Paris.", first.id)
    call = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
    assert engine.prompts[-1] == (
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        f"<|im_start|>assistant\n<tool_call>\n{call}\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nsun\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_previous_output_sent_back_as_input_items_is_the_same_conversation(engine, api):
    engine.script = [CALL_TEXT, "Sunny.", "Sunny."]
    first = api.responses.create(input="Weather in Paris?", tools=[WEATHER], tool_choice="required")
    result = {"type": "function_call_output", "call_id": first.output[0].call_id, "output": "sun"}
    api.responses.create(input=[result], previous_response_id=first.id)
    continued = engine.prompts[-1]
    items = [{"role": "user", "content": "Weather in Paris?"}, *first.output, result]
    api.responses.create(input=items)
    assert engine.prompts[-1] == continued


def test_instructions_of_the_previous_response_are_not_carried_over(engine, api):
    engine.script = ["One.", "Two."]
    first = api.responses.create(input="Count.", instructions="Be terse.")
    api.responses.create(input="Again.", previous_response_id=first.id, instructions="Be kind.")
    assert engine.prompts[-1] == (
        "<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user\nCount.<|im_end|>\n"
        "<|im_start|>assistant\nOne.<|im_end|>\n<|im_start|>user\nAgain.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_an_unstored_response_cannot_be_retrieved_or_continued(engine, api):
    engine.script = ["Not kept."]
    response = api.responses.create(input="Hi", store=False)
    assert (response.status, response.store) == ("completed", False)
    with pytest.raises(openai.NotFoundError, match=response.id):
        api.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError) as caught:
        api.responses.create(input="More", previous_response_id=response.id)
    assert caught.value.body["param"] == "previous_response_id"


def test_unknown_response_ids_are_404(api):
    for call in (api.responses.retrieve, api.responses.cancel):
        with pytest.raises(openai.NotFoundError) as caught:
            call("resp_unknown")
        assert caught.value.body["message"] == "Response with id 'resp_unknown' not found."


def test_cancelling_a_background_response_aborts_its_engine_request(engine, api):
    engine.script = [HANG]
    response = api.responses.create(input="A long story", background=True)
    assert (response.status, response.background) == ("in_progress", True)
    running = api.responses.retrieve(response.id)
    assert running.status == "in_progress"
    cancelled = api.responses.cancel(response.id)
    assert (cancelled.status, cancelled.output[0].status) == ("cancelled", "incomplete")
    assert engine.aborted == [f"{response.id}-0"]
    assert api.responses.retrieve(response.id).status == "cancelled"
    with pytest.raises(openai.BadRequestError, match="only a response in progress"):
        api.responses.cancel(response.id)


def test_a_finished_response_cannot_be_cancelled(engine, api):
    engine.script = ["Done."]
    response = api.responses.create(input="Hi")
    with pytest.raises(openai.BadRequestError, match="it is completed"):
        api.responses.cancel(response.id)


def test_a_background_response_runs_to_its_end_unwatched(engine, api):
    engine.script = ["Finished in the background."]
    response = api.responses.create(input="Hi", background=True)
    for _ in range(100):
        response = api.responses.retrieve(response.id)
        if response.status != "in_progress":
            break
    assert (response.status, response.output_text) == ("completed", "Finished in the background.")


@pytest.mark.parametrize(
    "tool",
    [
        {"type": "web_search_preview"},
        {"type": "file_search", "vector_store_ids": ["vs_1"]},
        {"type": "code_interpreter", "container": {"type": "auto"}},
        {
            "type": "computer_use_preview",
            "display_width": 1,
            "display_height": 1,
            "environment": "linux",
        },
        {"type": "image_generation"},
        {"type": "mcp", "server_label": "x", "server_url": "https://example.com"},
    ],
    ids=lambda tool: tool["type"],
)
def test_hosted_tools_are_refused_naming_their_type(api, tool):
    with pytest.raises(openai.BadRequestError) as caught:
        api.responses.create(input="Hi", tools=[WEATHER, tool])
    assert caught.value.body["param"] == "tools[1]"
    assert f"tool type '{tool['type']}' is not supported" in caught.value.body["message"]


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"reasoning": {"effort": "low"}}, "reasoning"),
        ({"truncation": "auto"}, "truncation"),
        ({"include": ["message.output_text.logprobs"]}, "include"),
        ({"text": {"format": {"type": "text"}, "verbosity": "low"}}, "text.verbosity"),
        ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
        ({"background": True, "store": False}, "background"),
        ({"max_output_tokens": 4096}, "max_output_tokens"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
        ({"input": [ENCRYPTED_REASONING]}, "input[0].encrypted_content"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_what_the_server_cannot_honour_is_a_400_naming_the_field(api, kwargs, param):
    with pytest.raises(openai.BadRequestError) as caught:
        api.responses.create(**{"input": "Hi", **kwargs})
    assert caught.value.body["param"] == param


def test_a_schema_the_grammar_backend_refuses_is_a_400_naming_text_format(api):
    text = {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nope"}}}
    with pytest.raises(openai.BadRequestError, match="invalid text.format: Unsupported type"):
        api.responses.create(input="Hi", text=text)


def test_an_engine_failure_fails_the_response(engine, api):
    engine.script = [ValueError("the engine cannot serve it"), ValueError("nor this one")]
    with pytest.raises(openai.BadRequestError, match="the engine cannot serve it"):
        api.responses.create(input="Hi")
    events = list(api.responses.create(input="Hi", stream=True))
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.failed",
    ]
    failed = events[-1].response
    assert (failed.status, failed.error.message) == ("failed", "nor this one")
    assert api.responses.retrieve(failed.id).status == "failed"


# --- under --reasoning-parser deepseek_r1 ----------------------------------------------------

THOUGHT, ANSWER = "The user greets me.", "Hello!"
END = 49153  # </think>'s id: SmolLM2's vocabulary holds 49152 tokens, then <think>, </think>
# The reasoning, </think> and the answer as a detokenizer sends them: the marker whole, with
# its token (the ids of the other tokens are made up), 5 tokens of reasoning before it.
THINKING = [
    ("The user", [101, 102]),
    (" greets me.", [103, 104, 105]),
    ("</think>Hel", [END, 106]),
    ("lo!", [107]),
]
# The same text in pieces of 4 characters, which cut the marker in two.
THINKING_TEXT = f"{THOUGHT}</think>{ANSWER}"


@pytest.fixture(scope="module")
def thinking_engine(engine) -> ScriptedEngine:
    thinking = ScriptedEngine(engine.processor)
    thinking.reasoning_parser = build_reasoning_parser("deepseek_r1", reasoning_tokenizer())
    assert thinking.reasoning_parser.end_token_id == END
    return thinking


@pytest.fixture(scope="module")
def thinking_api(thinking_engine):
    """A server with a reasoning parser, reading calls out of the content with the hermes
    parser (tool_choice auto)."""
    tool_calling = ToolCalling(tool_parser_class("hermes"), enable_auto_tool_choice=True)
    with TestClient(build_app(thinking_engine, tool_calling=tool_calling)) as http:
        yield openai.OpenAI(
            base_url="http://testserver/v1", api_key="unused", http_client=http, max_retries=0
        )


@pytest.fixture
def thinker(thinking_engine) -> ScriptedEngine:
    thinking_engine.script, thinking_engine.finish_reason = [], "stop"
    return thinking_engine


def test_reasoning_is_an_item_before_the_message_and_its_tokens_are_counted(thinker, thinking_api):
    thinker.script = [THINKING]
    response = thinking_api.responses.create(input="Hi")
    reasoning, message = response.output
    assert (reasoning.type, reasoning.status, reasoning.summary) == ("reasoning", "completed", [])
    assert reasoning.id.startswith("rs_")
    assert [(part.type, part.text) for part in reasoning.content] == [("reasoning_text", THOUGHT)]
    assert (message.type, response.output_text) == ("message", ANSWER)
    usage = response.usage
    assert (usage.output_tokens, usage.output_tokens_details.reasoning_tokens) == (8, 5)


@pytest.mark.parametrize("script", [THINKING, THINKING_TEXT], ids=["tokens", "cut_marker"])
def test_reasoning_streams_before_the_message_and_adds_up_to_the_whole(
    thinker, thinking_api, script
):
    thinker.script = [script, script]
    whole = thinking_api.responses.create(input="Hi")
    events = list(thinking_api.responses.create(input="Hi", stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    thoughts = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
    answers = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.reasoning_text.delta"] * len(thoughts),
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * len(answers),
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert len(thoughts) > 1  # streamed as it came, not at the end
    (thought_done,) = [e for e in events if e.type == "response.reasoning_text.done"]
    assert "".join(thoughts) == thought_done.text == THOUGHT
    assert "".join(answers) == ANSWER
    assert (events[2].item.type, events[3].part.type) == ("reasoning", "reasoning_text")
    final = events[-1].response
    ignored = {"id": True, "created_at": True, "output": {"__all__": {"id"}}}
    assert final.model_dump(exclude=ignored) == whole.model_dump(exclude=ignored)


def test_reasoning_cut_off_is_an_incomplete_reasoning_item_alone(thinker, thinking_api):
    thinker.script, thinker.finish_reason = [THINKING[:2]], "length"
    response = thinking_api.responses.create(input="Hi", max_output_tokens=5)
    (reasoning,) = response.output
    assert (response.status, reasoning.status, reasoning.content[0].text) == (
        "incomplete",
        "incomplete",
        THOUGHT,
    )
    assert response.usage.output_tokens_details.reasoning_tokens == 5


def test_previous_reasoning_is_left_out_of_the_next_prompt(thinker, thinking_api):
    thinker.script = [THINKING, "Fine.", "Fine."]
    first = thinking_api.responses.create(input="Hi")
    thinking_api.responses.create(input="How are you?", previous_response_id=first.id)
    assert thinker.prompts[-1] == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nHow are you?<|im_end|>\n<|im_start|>assistant\n"
    )
    continued = thinker.prompts[-1]
    sent_back = [{"role": "user", "content": "Hi"}, *first.output, "How are you?"]
    items = [{"role": "user", "content": i} if isinstance(i, str) else i for i in sent_back]
    thinking_api.responses.create(input=items)  # the reasoning item accepted, and left out
    assert thinker.prompts[-1] == continued


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_call_after_reasoning_is_read_from_the_content_only(thinker, thinking_api, stream):
    thought = "\nI could write <tool_call> here, but first: which city?\n"
    call = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
    thinker.script = [f"{thought}</think>\n\n<tool_call>\n{call}\n</tool_call>"]
    kwargs = {"input": "Weather?", "tools": [WEATHER]}
    if stream:
        response = list(thinking_api.responses.create(stream=True, **kwargs))[-1].response
    else:
        response = thinking_api.responses.create(**kwargs)
    reasoning, function_call = response.output
    assert reasoning.content[0].text == thought
    assert (function_call.name, json.loads(function_call.arguments)) == ("get_weather", ARGUMENTS)
