"""Llama 3.1/3.2 JSON calls: the output starts (after an optional `<|python_tag|>`) with
`{"name": ..., "parameters": {...}}`, several calls separated by ";".

Only an output that starts so holds calls; any other output is all content. When the first
object has no name, the whole output is content; text after the last call is content.
"""

from __future__ import annotations

from core.tool_parsers.incremental import IncrementalToolParser, ParsedOutput
from core.tool_parsers.json_calls import scan_call, skip_whitespace

__all__ = ["Llama3JsonToolParser"]

PYTHON_TAG = "<|python_tag|>"
SEPARATOR = ";"


class Llama3JsonToolParser(IncrementalToolParser):
    keeps_special_tokens = True  # <|python_tag|> is a special token

    def parse(self, text: str, final: bool) -> ParsedOutput:
        first = _first_object(text, final)
        if first is None:
            return ParsedOutput(content=text if final else "")
        if first < 0:
            return ParsedOutput(content=text)
        parsed = ParsedOutput()
        pos, rest = first, 0  # rest: where content would start (the whole text at first)
        while True:
            scan = scan_call(text, pos)
            call = scan.call()
            if call is None:
                parsed.content = text[rest:] if final or scan.end is not None else ""
                return parsed
            parsed.calls.append(call)
            if scan.end is None:
                return parsed
            pos, rest = _next_object(text, scan.end, final, parsed), scan.end
            if pos is None:
                return parsed


def _first_object(text: str, final: bool) -> int | None:
    """Where the first call object starts; -1 when the output holds no calls; None while
    that is undecided (only whitespace, or part of the python tag, so far)."""
    start = skip_whitespace(text, 0)
    rest = text[start:]
    if rest.startswith(PYTHON_TAG):
        start = skip_whitespace(text, start + len(PYTHON_TAG))
    elif PYTHON_TAG.startswith(rest):
        return -1 if final and rest else None
    if start == len(text):
        return -1 if final else None
    return start if text[start] == "{" else -1


def _next_object(text: str, end: int, final: bool, parsed: ParsedOutput) -> int | None:
    """After a call ending at `end`: where the next call object starts, or None when there
    is none (what follows, once decided, is content in `parsed`)."""
    after = skip_whitespace(text, end)
    if text.startswith(SEPARATOR, after):
        following = skip_whitespace(text, after + len(SEPARATOR))
        if following < len(text) and text[following] == "{":
            return following
        if following == len(text) and not final:
            return None
    elif after == len(text) and not final:
        return None
    parsed.content = text[end:]
    return None
