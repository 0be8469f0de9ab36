"""What text and JSON data from outside must be before anything processes them.

One rule each, kept here and applied at every entry point (the OpenAI server's request
models, the InputProcessor, the tokenizer, chat templates, SamplingParams), so bad input is
a ValueError naming its field instead of a TypeError deep in a library:

- Text is valid Unicode: no lone surrogates. JSON's ``"\\ud800"`` escape decodes to a
  Python str holding a surrogate code point, which UTF-8 cannot encode, so the tokenizer,
  msgspec and every JSON encoder downstream fail on it. (A valid pair, ``"\\ud83d\\ude00"``,
  decodes to one code point and is fine.)
- JSON data nests at most ``MAX_JSON_DEPTH`` containers deep (see there). The check walks
  the data with an explicit stack, so it cannot itself run out of recursion.
- An error about many bad values names the first few and counts the rest (`first_few`),
  so its size stays bounded whatever the input's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["MAX_JSON_DEPTH", "check_json_data", "check_text", "first_few", "parse_json_text"]

MAX_JSON_DEPTH = 64
"""The most containers (objects, arrays) JSON input may nest. Real payloads (template
kwargs, tool and response schemas) nest under 20 levels; every consumer downstream recurses
once per level (the chat template's copy, jinja's tojson, msgspec, and xgrammar's schema
compiler, whose time grows steeply with nesting: 10 s at 500 levels), and Python stops
recursing at 1,000 frames with the server's own stack already in use. 64 is far from both."""

_SURROGATE = re.compile("[\ud800-\udfff]")
# Values the walk skips: numbers, booleans and None cannot be wrong here (a set of exact
# types: the walk meets every token id of a prompt, and isinstance on ABCs is slow).
_LEAVES = frozenset({int, float, bool, type(None)})


def check_text(text: str, where: str) -> None:
    """ValueError when `text` holds a lone surrogate. The message starts with `where` (the
    field: ``prompt``, ``stop[1]``); an empty `where` leaves the subject to the caller, as
    pydantic's messages do after the field's location. It never quotes the text."""
    if text.isascii():
        return
    found = _SURROGATE.search(text)
    if found is not None:
        subject = f"{where} contains" if where else "contains"
        raise ValueError(
            f"{subject} a lone surrogate (U+{ord(found.group()):04X} at character "
            f"{found.start()}), which is not valid Unicode"
        )


def first_few(values: Sequence[object], limit: int = 5) -> str:
    """How an error quotes bad values: the first `limit` as a list, then how many more
    (``['a', 'b'] and 3 more``); a string longer than 40 characters is cut short."""
    shown = [_shortened(v) if isinstance(v, str) else v for v in values[:limit]]
    more = len(values) - limit
    return f"{shown!r} and {more} more" if more > 0 else repr(shown)


def _shortened(text: str) -> str:
    return text if len(text) <= 40 else text[:40] + "..."


def check_json_data(value: object, where: str) -> None:
    """ValueError when a string in `value` (a key or a value, at any depth) holds a lone
    surrogate, naming its path (``where.key[2]``), or when containers (mappings, lists,
    tuples) nest deeper than MAX_JSON_DEPTH, naming `where`. Other values pass unchecked."""
    pending: list[tuple[object, str, int]] = [(value, where, 0)]
    while pending:
        item, path, depth = pending.pop()
        if isinstance(item, str):
            check_text(item, path)
            continue
        children = _children(item, path)
        if children is None:
            continue
        if depth == MAX_JSON_DEPTH:
            subject = f"{where} is nested" if where else "nested"
            raise ValueError(f"{subject} deeper than {MAX_JSON_DEPTH} levels")
        pending.extend((child, child_path, depth + 1) for child, child_path in children)


def _children(item: object, path: str) -> list[tuple[object, str]] | None:
    """The members of a container with their paths (keys checked here); None for others."""
    if isinstance(item, Mapping):
        for key in item:
            if isinstance(key, str):
                check_text(key, f"{path} key" if path else "key")
        return [
            (child, f"{path}.{key}" if path else str(key))
            for key, child in item.items()
            if type(child) not in _LEAVES
        ]
    if isinstance(item, list | tuple):
        if _LEAVES.issuperset(map(type, item)):  # e.g. token ids: no per-item work
            return []
        return [
            (child, f"{path}[{i}]") for i, child in enumerate(item) if type(child) not in _LEAVES
        ]
    return None


def parse_json_text(text: str, where: str) -> Any:
    """The JSON value of `text`, checked as check_json_data does; ValueError naming `where`
    when it is not JSON, holds a lone surrogate, or nests too deep (Python's parser gives
    up with RecursionError past about 1,000 levels: that is too deep as well)."""
    check_text(text, where)
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(f"{where} is nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:
        raise ValueError(f"{where} is not valid JSON: {exc}") from None
    check_json_data(value, where)
    return value
