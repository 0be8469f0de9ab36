"""The pythonic parser (`[f(x=1), g()]`): keyword literals become a JSON arguments object."""

from __future__ import annotations

import json

import pytest
from tool_stream import assert_stream_matches_whole, streamed, whole

from core.tool_parsers.pythonic import PythonicToolParser

TWO_CALLS = "[get_weather(city='Paris', days=3), get_time(zone=None, exact=true)]"


def test_keyword_literals_become_json_arguments():
    content, calls = whole(PythonicToolParser(), TWO_CALLS)
    assert content is None
    assert [(name, json.loads(arguments)) for name, arguments in calls] == [
        ("get_weather", {"city": "Paris", "days": 3}),
        ("get_time", {"zone": None, "exact": True}),
    ]


def test_nested_literals_and_strings_with_brackets():
    text = '[plan(steps=["a)", "b]"], opts={"deep": (1, 2)}, note="x, y(")]'
    ((name, arguments),) = whole(PythonicToolParser(), text)[1]
    assert name == "plan"
    assert json.loads(arguments) == {
        "steps": ["a)", "b]"],
        "opts": {"deep": [1, 2]},
        "note": "x, y(",
    }


@pytest.mark.parametrize(
    "text",
    [
        "Paris is sunny.",
        "[1, 2, 3] are numbers",
        "[f(x=g())]",  # not a literal
        "[f(1)]",  # positional
        "[f(x={1, 2})]",  # a set is not JSON
    ],
)
def test_outputs_that_are_not_a_list_of_literal_calls_are_all_content(text):
    assert whole(PythonicToolParser(), text) == (text, [])


def test_from_a_call_that_does_not_parse_on_the_rest_is_content():
    text = "[now(), f(x=g())]"
    assert whole(PythonicToolParser(), text) == (", f(x=g())]", [("now", "{}")])


@pytest.mark.parametrize(
    "text", [TWO_CALLS, "Paris is sunny.", "[1, 2, 3] are numbers", "[now(), f(x=g())]"]
)
def test_stream_reassembles_to_the_whole_result(text):
    assert_stream_matches_whole(PythonicToolParser, text)


def test_stream_sends_each_call_whole_once_its_parenthesis_closes():
    result = streamed(PythonicToolParser, TWO_CALLS, 1)
    pieces = [(c.index, c.name) for d in result.deltas for c in d.tool_calls]
    assert pieces == [(0, "get_weather"), (1, "get_time")]
