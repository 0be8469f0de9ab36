"""A ToolParser written as one `parse(text, final)`, from which both extraction methods follow.

Streaming re-parses the output so far after every piece and sends what grew since the
last step: new content, a new call (id and name first), new argument text. Because whole
and streamed results come from the same parse, a stream always reassembles to the whole
result, provided `parse` keeps its one rule (prefix consistency, below).
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from core.tool_parsers.interface import (
    ExtractedToolCalls,
    StreamedDelta,
    ToolCall,
    ToolCallDelta,
    ToolParser,
    ToolRequest,
)

if TYPE_CHECKING:
    from core.tokenizer import Tokenizer

__all__ = ["IncrementalToolParser", "ParsedCall", "ParsedOutput", "without_partial_marker"]


@dataclass
class ParsedCall:
    name: str
    arguments: str  # the arguments' JSON text known so far


@dataclass
class ParsedOutput:
    content: str = ""  # text that is not part of any call, known so far
    calls: list[ParsedCall] = field(default_factory=list)


def without_partial_marker(text: str, marker: str) -> str:
    """`text` less a tail that may be the start of `marker` ("ab<too" -> "ab" for
    "<tool_call>"): whether that tail is content is known only once more text comes."""
    for length in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:length]):
            return text[:-length]
    return text


class IncrementalToolParser(ToolParser):
    """Implements the ToolParser contract from `parse`.

    `parse(text, final)` contract (prefix consistency): for an output t and any prefix p
    of it, `parse(p, final=False)` reports only what `parse(t, final=True)` reports too:
    its content is a prefix of the final content, and its calls are the first calls of the
    final result, with the same names and arguments that are prefixes of the final ones.
    So text whose role is still open (a partial marker, a call whose name is not complete)
    is left out until it is decided; with `final=True` everything is decided.
    """

    def __init__(self, tokenizer: Tokenizer | None = None) -> None:
        super().__init__(tokenizer)
        self._sent_content = 0  # characters of content sent so far
        self._sent_calls: list[tuple[str, int]] = []  # per call: its id, arguments sent

    @abstractmethod
    def parse(self, text: str, final: bool) -> ParsedOutput:
        """The content and calls of `text` (see the class docstring for the rule)."""

    def extract_tool_calls(self, model_output: str, request: ToolRequest) -> ExtractedToolCalls:
        parsed = self.parse(model_output, final=True)
        calls = [
            ToolCall(self.new_call_id(), call.name, call.arguments)
            for call in _allowed(parsed.calls, request)
        ]
        content = parsed.content if parsed.content.strip() else None
        return ExtractedToolCalls(bool(calls), calls, content)

    def extract_tool_calls_streaming(
        self, current_text: str, delta_text: str, request: ToolRequest, finished: bool
    ) -> StreamedDelta | None:
        parsed = self.parse(current_text, final=finished)
        content = self._new_content(parsed.content)
        calls = [self._call_delta(i, c) for i, c in enumerate(_allowed(parsed.calls, request))]
        calls = [delta for delta in calls if delta is not None]
        if content is None and not calls:
            return None
        return StreamedDelta(content=content, tool_calls=calls)

    def _new_content(self, content: str) -> str | None:
        # Whitespace-only content is held back: the whole result reports it as None.
        if not content.strip() or len(content) == self._sent_content:
            return None
        new, self._sent_content = content[self._sent_content :], len(content)
        return new

    def _call_delta(self, index: int, call: ParsedCall) -> ToolCallDelta | None:
        if index == len(self._sent_calls):
            call_id = self.new_call_id()
            self._sent_calls.append((call_id, len(call.arguments)))
            return ToolCallDelta(index, call.arguments, id=call_id, name=call.name)
        call_id, sent = self._sent_calls[index]
        if len(call.arguments) == sent:
            return None
        self._sent_calls[index] = (call_id, len(call.arguments))
        return ToolCallDelta(index, call.arguments[sent:])


def _allowed(calls: list[ParsedCall], request: ToolRequest) -> list[ParsedCall]:
    return calls if request.parallel_tool_calls else calls[:1]
