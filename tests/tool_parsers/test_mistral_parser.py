"""The mistral parser (`[TOOL_CALLS]` with a JSON array, or v11's `name[ARGS]{...}`)."""

from __future__ import annotations

import re

import pytest
from tool_stream import assert_stream_matches_whole, whole

from core.tool_parsers import ToolRequest
from core.tool_parsers.mistral import MistralToolParser

ARRAY = (
    '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
    '{"name": "get_time", "arguments": {}}]'
)
V11 = '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}'
EXPECTED_CALLS = [("get_weather", '{"city": "Paris"}'), ("get_time", "{}")]


@pytest.mark.parametrize("text", [ARRAY, V11])
def test_both_call_formats(text):
    assert whole(MistralToolParser(), text) == (None, EXPECTED_CALLS)


def test_text_before_the_calls_is_content():
    assert whole(MistralToolParser(), "Checking. " + ARRAY) == ("Checking. ", EXPECTED_CALLS)


@pytest.mark.parametrize(
    "text", ["No tools needed: it is 3 pm.", "brackets [TOOL_CALL are text", "ends with [TOOL_"]
)
def test_outputs_without_the_marker_are_all_content(text):
    assert whole(MistralToolParser(), text) == (text, [])


def test_a_marker_not_followed_by_a_call_is_content():
    assert whole(MistralToolParser(), "[TOOL_CALLS]not a call") == ("not a call", [])


@pytest.mark.parametrize("text", [ARRAY, V11, "Checking. " + ARRAY, "ends with [TOOL_"])
def test_stream_reassembles_to_the_whole_result(text):
    assert_stream_matches_whole(MistralToolParser, text)


def test_call_ids_have_mistrals_shape():
    parser = MistralToolParser()
    ids = [call.id for call in parser.extract_tool_calls(ARRAY, ToolRequest()).tool_calls]
    assert len(ids) == 2 and all(re.fullmatch(r"[A-Za-z0-9]{9}", i) for i in ids)
