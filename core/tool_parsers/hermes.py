"""Hermes-style calls (Hermes 2/3, Qwen2.5/3...): `<tool_call>{"name": ..., "arguments":
{...}}</tool_call>`, one block per call, anywhere in the output.

Text outside the blocks is content. A block whose object has no name is content too, and
a missing closing tag is tolerated (the object's closing brace ends the call).
"""

from __future__ import annotations

from core.tool_parsers.incremental import (
    IncrementalToolParser,
    ParsedOutput,
    without_partial_marker,
)
from core.tool_parsers.json_calls import scan_call, skip_whitespace

__all__ = ["HermesToolParser"]

START = "<tool_call>"
END = "</tool_call>"


class HermesToolParser(IncrementalToolParser):
    keeps_special_tokens = True  # <tool_call> is a special token in some vocabularies

    def parse(self, text: str, final: bool) -> ParsedOutput:
        parsed = ParsedOutput()
        pos = 0
        while pos is not None:
            start = text.find(START, pos)
            if start < 0:
                tail = text[pos:]
                parsed.content += tail if final else without_partial_marker(tail, START)
                return parsed
            parsed.content += text[pos:start]
            pos = _block(text, start, final, parsed)
        return parsed


def _block(text: str, start: int, final: bool, parsed: ParsedOutput) -> int | None:
    """Read the block at `text[start]` (its START tag) into `parsed`; where reading goes on,
    or None when the rest of `text` is still undecided (or, with `final`, consumed)."""
    body = skip_whitespace(text, start + len(START))
    if body == len(text):
        parsed.content += text[start:] if final else ""
        return None
    if text[body] != "{":
        parsed.content += text[start:body]  # a stray tag: plain text
        return body
    scan = scan_call(text, body)
    call = scan.call()
    if call is None:
        if scan.end is None:
            parsed.content += text[start:] if final else ""
            return None
        parsed.content += text[start : scan.end]
        return scan.end
    parsed.calls.append(call)
    if scan.end is None:
        return None
    after = skip_whitespace(text, scan.end)
    if text.startswith(END, after):
        return after + len(END)
    if not final and END.startswith(text[after:]):
        return None  # the closing tag may still be coming
    return scan.end
