"""Driving a ToolParser as the server does: whole outputs, and outputs streamed in pieces
whose deltas are put back together the way an OpenAI client does."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from core.tool_parsers import StreamedDelta, ToolParser, ToolRequest

# Piece sizes a stream is cut into: single characters, small pieces (tokens), all at once.
PIECE_SIZES = (1, 3, 7, 10_000)


@dataclass
class Reassembled:
    """A stream put back together: content joined, each call's name and arguments."""

    content: str = ""
    names: dict[int, str] = field(default_factory=dict)
    arguments: dict[int, str] = field(default_factory=dict)
    deltas: list[StreamedDelta] = field(default_factory=list)

    def calls(self) -> list[tuple[str, str]]:
        return [(self.names[i], self.arguments[i]) for i in sorted(self.names)]


def whole(parser: ToolParser, text: str, request: ToolRequest = ToolRequest()):
    """(content, [(name, arguments)]) of the whole output."""
    extracted = parser.extract_tool_calls(text, request)
    assert extracted.tools_called == bool(extracted.tool_calls)
    return extracted.content, [(c.name, c.arguments) for c in extracted.tool_calls]


def streamed(
    new_parser: Callable[[], ToolParser],
    text: str,
    piece_size: int,
    request: ToolRequest = ToolRequest(),
) -> Reassembled:
    """`text` fed to a fresh parser `piece_size` characters at a time, the last piece
    marked finished; every call's first delta must carry its id and name, later ones not."""
    parser, result = new_parser(), Reassembled()
    pieces = [text[i : i + piece_size] for i in range(0, len(text), piece_size)] or [""]
    for i, piece in enumerate(pieces):
        current = "".join(pieces[: i + 1])
        delta = parser.extract_tool_calls_streaming(current, piece, request, i == len(pieces) - 1)
        if delta is None:
            continue
        result.deltas.append(delta)
        result.content += delta.content or ""
        for call in delta.tool_calls:
            first = call.index not in result.names
            assert (call.name is not None) == first and (call.id is not None) == first
            if first:
                result.names[call.index] = call.name
                result.arguments[call.index] = ""
            result.arguments[call.index] += call.arguments
    return result


def assert_stream_matches_whole(
    new_parser: Callable[[], ToolParser], text: str, request: ToolRequest = ToolRequest()
) -> None:
    """For every piece size, the stream reassembles to the whole output's result."""
    content, calls = whole(new_parser(), text, request)
    for size in PIECE_SIZES:
        result = streamed(new_parser, text, size, request)
        assert result.content == (content or ""), f"content, pieces of {size}"
        assert result.calls() == calls, f"calls, pieces of {size}"
