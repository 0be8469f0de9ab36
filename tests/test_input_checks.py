"""core.input_checks: what text and JSON data from outside must be, with the field named."""

from __future__ import annotations

import json

import pytest

from core.input_checks import (
    MAX_JSON_DEPTH,
    check_json_data,
    check_text,
    first_few,
    parse_json_text,
)

LONE = json.loads('"ab\\ud800"')  # what a client's JSON escape decodes to


def nested(levels: int, leaf: object = None) -> list:
    """`levels` lists, one inside the other, built without recursion."""
    value = leaf
    for _ in range(levels):
        value = [value]
    return value


def test_the_depth_limit_is_64_levels():
    assert MAX_JSON_DEPTH == 64


@pytest.mark.parametrize(
    ("text", "code_point", "index"),
    [(LONE, "D800", 2), ("\udfff", "DFFF", 0), ("é\udc80", "DC80", 1)],
)
def test_a_lone_surrogate_is_refused_naming_the_field_and_where_it_is(text, code_point, index):
    with pytest.raises(ValueError) as error:
        check_text(text, "prompt")
    assert str(error.value) == (
        f"prompt contains a lone surrogate (U+{code_point} at character {index}), "
        "which is not valid Unicode"
    )


def test_without_a_field_name_the_message_leaves_the_subject_to_the_caller():
    with pytest.raises(ValueError, match="^contains a lone surrogate"):
        check_text(LONE, "")
    with pytest.raises(ValueError, match=r"^\[1\] contains a lone surrogate"):
        check_json_data(["ok", LONE], "")
    with pytest.raises(ValueError, match="^nested deeper than 64 levels$"):
        check_json_data(nested(65), "")


@pytest.mark.parametrize("text", ["plain", "héllo wörld", json.loads('"\\ud83d\\ude00"'), ""])
def test_valid_text_passes(text):
    check_text(text, "prompt")
    check_json_data({"k": [text, {text: text}]}, "kwargs")


def test_json_data_names_the_path_to_the_bad_string_or_key():
    with pytest.raises(ValueError, match=r"^kwargs\.a\[1\]\.b contains a lone surrogate"):
        check_json_data({"a": [1, {"b": LONE}]}, "kwargs")
    with pytest.raises(ValueError, match=r"^kwargs\.a key contains a lone surrogate"):
        check_json_data({"a": {LONE: 1}}, "kwargs")
    with pytest.raises(ValueError, match=r"^stop\[0\] contains"):
        check_json_data((LONE,), "stop")


def test_nesting_to_the_limit_passes_and_one_level_more_is_refused():
    check_json_data(nested(64), "x")
    check_json_data(json.loads('{"a":' * 63 + "{}" + "}" * 63), "x")
    with pytest.raises(ValueError, match="^x is nested deeper than 64 levels$"):
        check_json_data(nested(65), "x")
    with pytest.raises(ValueError, match="^x is nested deeper than 64 levels$"):
        check_json_data(json.loads('{"a":' * 64 + "{}" + "}" * 64), "x")


def test_far_deeper_data_is_refused_without_recursing():
    with pytest.raises(ValueError, match="nested deeper"):
        check_json_data(nested(200_000), "x")


def test_numbers_and_token_id_lists_pass():
    check_json_data([list(range(1000)), 1.5, True, None, {"n": 3}], "prompt")


def test_parse_json_text_gives_the_value_or_a_value_error_naming_where():
    assert parse_json_text('{"a": [1, "b"]}', "args") == {"a": [1, "b"]}
    with pytest.raises(ValueError, match="^args is not valid JSON: "):
        parse_json_text("{nope", "args")
    with pytest.raises(ValueError, match=r"^args\.a contains a lone surrogate"):
        parse_json_text('{"a": "\\ud800"}', "args")
    # Past Python's own parser's limit (a RecursionError there) and just past ours.
    for levels in (5000, 65):
        with pytest.raises(ValueError, match="^args is nested deeper than 64 levels$"):
            parse_json_text("[" * levels + "]" * levels, "args")


def test_an_error_quotes_the_first_five_values_and_counts_the_rest_cut_short():
    assert first_few([3, 1]) == "[3, 1]"
    assert first_few(list(range(7))) == "[0, 1, 2, 3, 4] and 2 more"
    assert first_few(["a", "b" * 41], limit=1) == "['a'] and 1 more"
    assert first_few(["b" * 41]) == "['" + "b" * 40 + "...']"
