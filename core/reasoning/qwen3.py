"""`qwen3`: Qwen3, which thinks only when its output opens with `<think>`."""

from __future__ import annotations

from core.reasoning.interface import ReasoningSplit
from core.reasoning.think_tags import ThinkTagReasoningParser

__all__ = ["Qwen3ReasoningParser"]


class Qwen3ReasoningParser(ThinkTagReasoningParser):
    """Reasoning is what the output writes between `<think>` and the next `</think>`;
    everything else is content. An output without `<think>` (thinking switched off, or
    a model that answered at once) is all content, a stray `</think>` included.

    As vLLM's parser, except in two cases its own whole and streamed splits disagree on,
    settled here the way its streams go so that a stream adds up to the whole: text
    before `<think>` stays content (vLLM drops it from a whole output), and an output cut
    off before `</think>` is reasoning (vLLM returns it whole as content).
    """

    def extract_reasoning(self, text: str) -> ReasoningSplit:
        before, opened, rest = text.partition(self.start_tag)
        if not opened:
            return ReasoningSplit(None, text or None)
        reasoning, _, after = rest.partition(self.end_tag)
        return ReasoningSplit(reasoning or None, (before + after) or None)
