"""ReasoningStream: one streamed output split into reasoning and content as it arrives."""

from __future__ import annotations

from typing import TYPE_CHECKING

from core.reasoning.interface import ReasoningSplit

if TYPE_CHECKING:
    from core.reasoning.interface import ReasoningParser

__all__ = ["ReasoningStream"]


class ReasoningStream:
    """Splits one output piece by piece with its parser: each `step` returns the reasoning
    and content that the new piece adds.

    Over a whole stream, the reasoning pieces joined and the content pieces joined equal
    the parser's `extract_reasoning` of the whole text, wherever the pieces were cut (a
    marker split across pieces included): each step splits the text so far, less a tail
    that could be the start of a marker, and sends what the split grew by, which the
    parser's prefix stability makes an extension of what was sent.
    """

    def __init__(self, parser: ReasoningParser) -> None:
        self._parser = parser
        self._longest_marker = max(map(len, parser.markers), default=0)
        self._text = ""
        self._num_sent = (0, 0)  # characters of reasoning and content sent so far

    def step(self, delta_text: str, finished: bool = False) -> ReasoningSplit:
        """What `delta_text`, the output's next piece, adds to each part (None: nothing);
        `finished` on the last piece releases whatever was held back."""
        self._text += delta_text
        end = len(self._text) if finished else len(self._text) - self._partial_marker_length()
        split = self._parser.extract_reasoning(self._text[:end])
        reasoning, content = split.reasoning or "", split.content or ""
        sent_reasoning, sent_content = self._num_sent
        self._num_sent = (len(reasoning), len(content))
        return ReasoningSplit(reasoning[sent_reasoning:] or None, content[sent_content:] or None)

    def _partial_marker_length(self) -> int:
        """Characters at the end of the text that could begin a marker (0: none)."""
        for n in range(min(len(self._text), self._longest_marker - 1), 0, -1):
            tail = self._text[-n:]
            if any(len(m) > n and m.startswith(tail) for m in self._parser.markers):
                return n
        return 0
