"""The hermes parser (`<tool_call>{json}</tool_call>`) on canned outputs, whole and streamed."""

from __future__ import annotations

import pytest
from tool_stream import assert_stream_matches_whole, streamed, whole

from core.tool_parsers import ToolRequest
from core.tool_parsers.hermes import HermesToolParser

WEATHER = '{"city": "Paris", "unit": "celsius"}'
ONE_CALL = (
    "Let me check.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
    "</tool_call>"
)
TWO_CALLS = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'
)


def test_one_call_after_some_text():
    assert whole(HermesToolParser(), ONE_CALL) == (
        "Let me check.\n",
        [("get_weather", WEATHER)],
    )


def test_two_calls_and_no_content():
    assert whole(HermesToolParser(), TWO_CALLS) == (
        None,
        [("get_weather", '{"city": "Paris"}'), ("get_time", '{"zone": "CET"}')],
    )


def test_parallel_tool_calls_false_keeps_the_first_call_only():
    request = ToolRequest(parallel_tool_calls=False)
    assert whole(HermesToolParser(), TWO_CALLS, request)[1] == [
        ("get_weather", '{"city": "Paris"}')
    ]
    assert streamed(HermesToolParser, TWO_CALLS, 3, request).calls() == [
        ("get_weather", '{"city": "Paris"}')
    ]


@pytest.mark.parametrize(
    "text",
    [
        "The weather in Paris is mild.",
        "a < b and <tool is not a tag",
        "unfinished tag at the end <tool_",
        "<tool_call>not json</tool_call> so this is text",
        '<tool_call>{"arguments": {"city": "Paris"}}</tool_call>',  # no name
    ],
)
def test_outputs_without_a_call_are_all_content(text):
    assert whole(HermesToolParser(), text) == (text, [])


def test_call_without_arguments_gets_an_empty_object_and_missing_end_tag_is_tolerated():
    assert whole(HermesToolParser(), '<tool_call>{"name": "now"}') == (None, [("now", "{}")])


def test_text_after_a_call_is_content():
    text = '<tool_call>{"name": "now"}</tool_call>\nDone.'
    assert whole(HermesToolParser(), text) == ("\nDone.", [("now", "{}")])


@pytest.mark.parametrize(
    "text",
    [
        ONE_CALL,
        TWO_CALLS,
        "The weather in Paris is mild.",
        "unfinished tag at the end <tool_",
        '<tool_call>{"arguments": {"city": "Paris"}}</tool_call>',
        '<tool_call>{"name": "now"}</tool_call>\nDone.',
        '<tool_call>{"name": "say", "arguments": {"text": "}</tool_call> \\" {"}}</tool_call>',
    ],
)
def test_stream_reassembles_to_the_whole_result(text):
    assert_stream_matches_whole(HermesToolParser, text)


def test_stream_sends_the_name_before_the_arguments_are_complete_and_holds_tags_back():
    result = streamed(HermesToolParser, ONE_CALL, 1)
    fragments = [c.arguments for d in result.deltas for c in d.tool_calls]
    assert fragments[0] == "" and len(fragments) > 2  # the name, then the arguments in pieces
    contents = [d.content for d in result.deltas if d.content]
    assert "".join(contents) == "Let me check.\n" and not any("<" in c for c in contents)


def test_arguments_are_the_models_own_json_text():
    text = '<tool_call>{"name": "f", "arguments": {"b":1,  "a": [1, 2]}}</tool_call>'
    assert whole(HermesToolParser(), text)[1] == [("f", '{"b":1,  "a": [1, 2]}')]


def test_markup_is_special_tokens_to_keep():
    assert HermesToolParser.keeps_special_tokens
