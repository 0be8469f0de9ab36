"""Mistral calls: `[TOOL_CALLS]` then a JSON array of `{"name": ..., "arguments": {...}}`
objects, or (v11+ tokenizers) `[TOOL_CALLS]name[ARGS]{...}`, once per call.

Text before and after the calls is content. Call ids have Mistral's shape (9 letters and
digits): its chat templates refuse any other in the conversation sent back.
"""

from __future__ import annotations

import re
import secrets
import string

from core.tool_parsers.incremental import (
    IncrementalToolParser,
    ParsedCall,
    ParsedOutput,
    without_partial_marker,
)
from core.tool_parsers.json_calls import scan_call_array, skip_whitespace, value_end

__all__ = ["MistralToolParser"]

MARKER = "[TOOL_CALLS]"
ARGS = "[ARGS]"
_NAME = re.compile(r"[\w.-]+")
_ID_ALPHABET = string.ascii_letters + string.digits


class MistralToolParser(IncrementalToolParser):
    keeps_special_tokens = True  # [TOOL_CALLS] and [ARGS] are special tokens

    def new_call_id(self) -> str:
        return "".join(secrets.choice(_ID_ALPHABET) for _ in range(9))

    def parse(self, text: str, final: bool) -> ParsedOutput:
        parsed = ParsedOutput()
        pos: int | None = 0
        while pos is not None:
            start = text.find(MARKER, pos)
            if start < 0:
                tail = text[pos:]
                parsed.content += tail if final else without_partial_marker(tail, MARKER)
                return parsed
            parsed.content += text[pos:start]
            pos = _calls(text, start + len(MARKER), final, parsed)
        return parsed


def _calls(text: str, pos: int, final: bool, parsed: ParsedOutput) -> int | None:
    """Read the calls after a marker into `parsed`; where reading goes on, or None when the
    rest of `text` is still undecided (or, with `final`, consumed)."""
    body = skip_whitespace(text, pos)
    if body == len(text):
        return None
    if text[body] == "[":
        calls, end = scan_call_array(text, body)
        parsed.calls.extend(calls)
        return end
    return _named_call(text, body, final, parsed)


def _named_call(text: str, body: int, final: bool, parsed: ParsedOutput) -> int | None:
    """`name[ARGS]{...}`; text that is not that shape is content."""
    args = text.find(ARGS, body)
    name = text[body:args].strip() if args >= 0 else ""
    if not _NAME.fullmatch(name):
        if final or args >= 0:
            parsed.content += text[body:]
        return None
    value_start = skip_whitespace(text, args + len(ARGS))
    if value_start == len(text):
        parsed.calls.append(ParsedCall(name, ""))
        return None
    end = value_end(text, value_start)
    parsed.calls.append(ParsedCall(name, text[value_start : len(text) if end is None else end]))
    return end
