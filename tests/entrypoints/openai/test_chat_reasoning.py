"""Chat choices under --reasoning-parser: the reasoning is split off first, and tool calls
are read from the content alone, whole and streamed alike (the reasoning below mentions a
<tool_call> that must not be read as one)."""

from __future__ import annotations

import json

import pytest
from think_vocab import think_tokenizer

from core.entrypoints.openai import protocol as p
from core.entrypoints.openai import responses as r
from core.entrypoints.openai.reasoning import output_reasoning_parser, reasoning_sampling_params
from core.entrypoints.openai.tool_calls import ToolCalling
from core.outputs import CompletionOutput
from core.reasoning import ReasoningStream, build_reasoning_parser
from core.sampling_params import SamplingParams
from core.tool_parsers import tool_parser_class

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
REASONING = "\nI could write <tool_call> here, but first: which city?\n"
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TEXT = f"{REASONING}</think>\n\n{CALL}"


@pytest.fixture(scope="module")
def parser():
    return build_reasoning_parser("deepseek_r1", think_tokenizer())


@pytest.fixture(scope="module")
def plan(parser):
    calling = ToolCalling(tool_parser_class("hermes"), enable_auto_tool_choice=True)
    request = p.ChatCompletionRequest(
        model="m", messages=[{"role": "user", "content": "Weather?"}], tools=[WEATHER]
    )
    return calling.plan(request, parser.tokenizer)


def sample(text: str, finish_reason: str | None = "stop") -> CompletionOutput:
    return CompletionOutput(0, text, [], None, None, finish_reason)


def test_a_whole_choice_reads_tool_calls_from_the_content_only(parser, plan):
    choice = r.chat_choice(sample(TEXT), str, tools=plan, reasoning=parser)
    message = choice.message
    assert message.reasoning_content == REASONING
    assert message.content is None
    [call] = message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "get_weather",
        {"city": "Paris"},
    )
    assert choice.finish_reason == "tool_calls"


@pytest.mark.parametrize("size", [1, 3, 7])
def test_a_streamed_choice_gives_the_same_reasoning_and_calls(parser, plan, size):
    reasoning_stream, tool_stream = ReasoningStream(parser), plan.stream()
    pieces = [TEXT[i : i + size] for i in range(0, len(TEXT), size)]
    reasoning, arguments, names, reasons = "", "", [], []
    for i, piece in enumerate(pieces):
        last = i == len(pieces) - 1
        choice = r.chat_stream_choice(
            sample(piece, "stop" if last else None), str, role="assistant" if i == 0 else None,
            tools=tool_stream, reasoning=reasoning_stream,
        )  # fmt: skip
        if choice is None:
            continue
        assert not choice.delta.content
        reasoning += choice.delta.reasoning_content or ""
        for call in choice.delta.tool_calls or []:
            names += [call.function.name] if call.function.name else []
            arguments += call.function.arguments or ""
        reasons.append(choice.finish_reason)
    assert reasoning == REASONING
    assert (names, json.loads(arguments)) == (["get_weather"], {"city": "Paris"})
    assert reasons[-1] == "tool_calls"


def test_without_tools_the_content_is_the_answer_and_none_when_empty(parser):
    message = r.chat_choice(sample("hmm</think>42"), str, reasoning=parser).message
    assert (message.reasoning_content, message.content) == ("hmm", "42")
    message = r.chat_choice(sample("cut off while thinking"), str, reasoning=parser).message
    assert (message.reasoning_content, message.content) == ("cut off while thinking", None)


def test_a_prompt_that_closed_the_reasoning_leaves_the_output_all_content(parser):
    start, end = parser.start_token_id, parser.end_token_id
    assert output_reasoning_parser(parser, [7, start]) is parser
    assert output_reasoning_parser(parser, [start, 7, end]) is None
    assert output_reasoning_parser(None, [start]) is None


def test_special_marker_tokens_are_kept_in_the_text(parser):
    assert not reasoning_sampling_params(parser, SamplingParams()).skip_special_tokens
    plain = build_reasoning_parser("deepseek_r1", think_tokenizer(special=False))
    assert reasoning_sampling_params(plain, SamplingParams()).skip_special_tokens
