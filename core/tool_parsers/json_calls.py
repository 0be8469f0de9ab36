"""Scanning calls written as JSON objects (`{"name": ..., "arguments": {...}}`) in text that
may stop anywhere, as streamed text does.

Only what a parser needs is read: where a value ends (strings and nesting respected), the
top-level `name` once its string is complete, and the raw text of `arguments` (or
`parameters`, Llama's key) as far as it goes. Arguments stay the model's own text, so a
longer prefix of the output only ever extends them (the prefix rule of
`core.tool_parsers.incremental`). Nothing here raises on malformed JSON: a scan reports
what it could read.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from core.tool_parsers.incremental import ParsedCall

__all__ = ["CallScan", "scan_call", "scan_call_array", "skip_whitespace", "value_end"]

_WHITESPACE = re.compile(r"[ \t\r\n]*")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_STRUCTURAL = re.compile(r'["{}\[\]]')
_LITERAL_END = re.compile(r"[,}\] \t\r\n]")
_ARGUMENT_KEYS = ("arguments", "parameters")


def skip_whitespace(text: str, pos: int) -> int:
    return _WHITESPACE.match(text, pos).end()  # type: ignore[union-attr]  # matches ""


def value_end(text: str, start: int) -> int | None:
    """The index just past the JSON value that starts at `text[start]`; None when the
    text ends before the value does (a literal running to the end may still grow)."""
    if text[start] == '"':
        string = _STRING.match(text, start)
        return string.end() if string else None
    if text[start] not in "{[":
        literal_end = _LITERAL_END.search(text, start)
        return literal_end.start() if literal_end else None
    depth, pos = 0, start
    while (found := _STRUCTURAL.search(text, pos)) is not None:
        char, pos = found.group(), found.start()
        if char == '"':
            string = _STRING.match(text, pos)
            if string is None:
                return None
            pos = string.end()
            continue
        depth += 1 if char in "{[" else -1
        pos += 1
        if depth == 0:
            return pos
    return None


@dataclass(frozen=True)
class CallScan:
    """A call object read from `text[start]` ("{"): `end` is just past its closing brace
    (None while open); `name` the top-level name once complete; `arguments` the raw text
    of the arguments value so far ("{}" when the object closed without one)."""

    end: int | None
    name: str | None
    arguments: str

    def call(self) -> ParsedCall | None:
        return None if self.name is None else ParsedCall(self.name, self.arguments)


def scan_call(text: str, start: int) -> CallScan:
    """Read the object at `text[start]` (which must be "{"); see CallScan. Only the first
    `name` and the first arguments key count, so later keys never change a reported value."""
    end = value_end(text, start)
    stop = len(text) if end is None else end
    name: str | None = None
    arguments: str | None = None
    pos = start + 1
    while (key := _key_at(text, pos, stop)) is not None:
        key_name, value_start = key
        found_end = value_end(text, value_start)
        if key_name == "name" and name is None and found_end is not None:
            name = _json_string(text[value_start:found_end])
        elif key_name in _ARGUMENT_KEYS and arguments is None:
            arguments = text[value_start : stop if found_end is None else found_end]
        if found_end is None:
            break
        pos = skip_whitespace(text, found_end)
        pos += text.startswith(",", pos)
    if arguments is None:
        arguments = "" if end is None else "{}"
    return CallScan(end, name, arguments)


def scan_call_array(text: str, start: int) -> tuple[list[ParsedCall], int | None]:
    """The calls of the JSON array at `text[start]` ("["), and the index just past it (None
    while it is open). Elements that are not call objects are skipped."""
    calls: list[ParsedCall] = []
    pos = start + 1
    while (pos := skip_whitespace(text, pos)) < len(text):
        if text[pos] == "]":
            return calls, pos + 1
        if text[pos] == ",":
            pos += 1
            continue
        if text[pos] != "{":
            element_end = value_end(text, pos)
            if element_end is None:
                break
            pos = element_end
            continue
        scan = scan_call(text, pos)
        if (call := scan.call()) is not None:
            calls.append(call)
        if scan.end is None:
            break
        pos = scan.end
    return calls, None


def _key_at(text: str, pos: int, stop: int) -> tuple[str, int] | None:
    """(key, where its value starts) for a `"key": value` member at `pos`; None when there
    is none before `stop` (the object's end, malformed text, or text still to come)."""
    pos = skip_whitespace(text, pos)
    key = _STRING.match(text, pos) if pos < stop else None
    if key is None or key.end() > stop:
        return None
    colon = skip_whitespace(text, key.end())
    if not text.startswith(":", colon):
        return None
    value_start = skip_whitespace(text, colon + 1)
    key_name = _json_string(key.group())
    if key_name is None or value_start >= stop:
        return None
    return key_name, value_start


def _json_string(literal: str) -> str | None:
    """The string a JSON string literal denotes; None when it is not a valid one."""
    try:
        value = json.loads(literal)
    except ValueError:
        return None
    return value if isinstance(value, str) else None
