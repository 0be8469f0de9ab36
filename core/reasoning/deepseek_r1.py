"""`deepseek_r1`: DeepSeek-R1 and its distills, which answer after thinking, always."""

from __future__ import annotations

from core.reasoning.interface import ReasoningSplit
from core.reasoning.think_tags import ThinkTagReasoningParser

__all__ = ["DeepSeekR1ReasoningParser"]


class DeepSeekR1ReasoningParser(ThinkTagReasoningParser):
    """Everything before `</think>` is reasoning, everything after it content; an output
    with no `</think>` (cut short) is all reasoning. The chat template usually ends the
    prompt with `<think>`, so the output starts inside the reasoning; a model that opens
    it itself writes `<think>` first, and that marker is dropped (as vLLM's parser does).
    """

    def extract_reasoning(self, text: str) -> ReasoningSplit:
        reasoning, _, content = text.partition(self.end_tag)
        reasoning = reasoning.replace(self.start_tag, "", 1)
        return ReasoningSplit(reasoning or None, content or None)
