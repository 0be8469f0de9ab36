"""check_grammar refuses a constraint no text satisfies, and only what it can prove so."""

from __future__ import annotations

import pytest

from core.sampling_params import StructuredOutputsParams
from core.structured_output.language import check_grammar

EMPTY = [
    ("regex", r"[^\s\S]"),
    ("regex", r"a[^\s\S]"),  # a first byte is allowed, then nothing
    ("regex", r"(ab|cd)[^\s\S]x*"),
    ("grammar", "root ::= root"),
    ("grammar", 'root ::= "a" b\nb ::= b "c"'),
]
NON_EMPTY = [
    ("regex", "x?"),  # the empty text only
    ("regex", "a{100}"),  # the shortest text is past the search's depth: never refused
    ("regex", r"[^\s\S]|z"),
    ("grammar", 'root ::= "a" | "b" root'),
    ("choice", ["yes", "no"]),
    ("json", {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}),
    ("json_object", True),
]


@pytest.mark.parametrize(("kind", "value"), EMPTY)
def test_an_empty_language_is_refused_naming_its_field(kind, value):
    with pytest.raises(ValueError, match=rf"^invalid structured_outputs\.{kind}: no text can"):
        check_grammar(StructuredOutputsParams(**{kind: value}))


@pytest.mark.parametrize(("kind", "value"), NON_EMPTY)
def test_a_language_with_some_text_is_accepted(kind, value):
    check_grammar(StructuredOutputsParams(**{kind: value}))


def test_a_constraint_that_does_not_parse_is_still_refused_as_before():
    with pytest.raises(ValueError, match=r"^invalid structured_outputs\.regex: "):
        check_grammar(StructuredOutputsParams(regex="("))
