"""The llama3_json parser (output starting with `{"name": ..., "parameters": ...}`)."""

from __future__ import annotations

import pytest
from tool_stream import assert_stream_matches_whole, streamed, whole

from core.tool_parsers.llama3_json import Llama3JsonToolParser

ONE_CALL = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
TAGGED = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}'
TWO_CALLS = '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time"}'


@pytest.mark.parametrize("text", [ONE_CALL, TAGGED, "  \n" + ONE_CALL])
def test_one_call_with_or_without_the_python_tag(text):
    assert whole(Llama3JsonToolParser(), text) == (None, [("get_weather", '{"city": "Paris"}')])


def test_calls_separated_by_semicolons():
    assert whole(Llama3JsonToolParser(), TWO_CALLS) == (
        None,
        [("get_weather", '{"city": "Paris"}'), ("get_time", "{}")],
    )


def test_arguments_key_is_read_too():
    text = '{"name": "f", "arguments": {"x": 1}}'
    assert whole(Llama3JsonToolParser(), text) == (None, [("f", '{"x": 1}')])


@pytest.mark.parametrize(
    "text",
    [
        "Paris is sunny today.",
        '{"answer": 42}',
        'Here: {"name": "get_weather", "parameters": {}}',  # a call only at the start
        "<|python",
    ],
)
def test_outputs_that_do_not_start_with_a_call_are_all_content(text):
    assert whole(Llama3JsonToolParser(), text) == (text, [])


def test_text_after_the_calls_is_content():
    text = '{"name": "get_time"} Done.'
    assert whole(Llama3JsonToolParser(), text) == (" Done.", [("get_time", "{}")])


@pytest.mark.parametrize(
    "text",
    [ONE_CALL, TAGGED, TWO_CALLS, "Paris is sunny today.", '{"answer": 42}', "<|python"],
)
def test_stream_reassembles_to_the_whole_result(text):
    assert_stream_matches_whole(Llama3JsonToolParser, text)


def test_stream_holds_a_leading_brace_until_it_is_known_to_be_a_call():
    result = streamed(Llama3JsonToolParser, '{"answer": 42}', 1)
    assert [d.content for d in result.deltas] == ['{"answer": 42}']
