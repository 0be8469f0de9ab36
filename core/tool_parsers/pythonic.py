"""Pythonic calls (Llama 3.2/4, ToolACE...): the output is a Python list of calls with
keyword arguments of literal values, `[get_weather(city="Paris"), get_time()]`.

Arguments become a JSON object (`{"city": "Paris"}`), so a call is reported whole, once its
closing parenthesis is read: a stream sends each call's name and arguments in one piece.
An output that does not start with such a list is content; from a call that does not parse
on, the rest of the output is content.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from core.tool_parsers.incremental import IncrementalToolParser, ParsedCall, ParsedOutput
from core.tool_parsers.json_calls import skip_whitespace

__all__ = ["PythonicToolParser"]

_CALL_START = re.compile(r"([A-Za-z_][\w.]*)[ \t]*\(")
_MAYBE_CALL_START = re.compile(r"[A-Za-z_][\w.]*[ \t]*")
_QUOTED = re.compile(r"""'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*\"""", re.DOTALL)
_BRACKETS = re.compile(r"""['"()\[\]{}]""")
# JSON spellings models write inside Python calls.
_JSON_NAMES = {"true": True, "false": False, "null": None}


class PythonicToolParser(IncrementalToolParser):
    def parse(self, text: str, final: bool) -> ParsedOutput:
        start = skip_whitespace(text, 0)
        if start == len(text):
            return ParsedOutput(content=text if final else "")
        if text[start] != "[":
            return ParsedOutput(content=text)
        calls: list[ParsedCall] = []
        pos, rest = start + 1, 0  # rest: where content would start (the whole text at first)
        while True:
            pos = skip_whitespace(text, pos)
            call = _CALL_START.match(text, pos)
            if call is None:
                more = pos == len(text) or _MAYBE_CALL_START.fullmatch(text, pos)
                undecided = not final and more
                return ParsedOutput("" if undecided else text[rest:], calls)
            close = _closing_paren(text, call.end() - 1)
            arguments = None if close is None else _arguments_json(text[call.end() : close - 1])
            if arguments is None:
                undecided = close is None and not final
                return ParsedOutput("" if undecided else text[rest:], calls)
            calls.append(ParsedCall(call.group(1), arguments))
            rest, pos = close, skip_whitespace(text, close)
            if text.startswith(",", pos):
                pos += 1
                continue
            if text.startswith("]", pos):
                return ParsedOutput(text[pos + 1 :], calls)
            return ParsedOutput(text[rest:] if final or pos < len(text) else "", calls)


def _closing_paren(text: str, open_pos: int) -> int | None:
    """The index just past the parenthesis that closes the one at `open_pos` (quotes and
    brackets respected); None when the text ends first."""
    depth, pos = 0, open_pos
    while (found := _BRACKETS.search(text, pos)) is not None:
        char, pos = found.group(), found.start()
        if char in "'\"":
            quoted = _QUOTED.match(text, pos)
            if quoted is None:
                return None
            pos = quoted.end()
            continue
        depth += 1 if char in "([{" else -1
        pos += 1
        if depth == 0:
            return pos
    return None


def _arguments_json(source: str) -> str | None:
    """The keyword arguments `source` as a JSON object; None unless every argument is a
    keyword with a literal value."""
    try:
        call = ast.parse(f"f({source})", mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(call, ast.Call) or call.args:
        return None
    if any(kw.arg is None for kw in call.keywords):
        return None  # a **mapping argument
    try:
        values = {kw.arg: _literal(kw.value) for kw in call.keywords}
        return json.dumps(values, ensure_ascii=False)
    except (ValueError, TypeError):  # not a literal, or not JSON (a tuple key, ...)
        return None


def _literal(node: ast.expr) -> Any:
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, ast.List | ast.Tuple):
        return [_literal(item) for item in node.elts]
    if isinstance(node, ast.Dict):
        if any(key is None for key in node.keys):
            raise ValueError("** in a dict literal")
        pairs = zip(node.keys, node.values, strict=True)
        return {_literal(key): _literal(value) for key, value in pairs}  # type: ignore[arg-type]
    value = ast.literal_eval(node)
    if isinstance(value, set | bytes | complex):
        raise ValueError(f"{type(value).__name__} is not JSON")
    return value
