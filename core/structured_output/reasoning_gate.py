"""ReasoningGate: which of a request's tokens its grammar sees when the model reasons first.

With a reasoning parser (`--reasoning-parser`), a structured-output request's grammar
constrains only what follows the reasoning: the model thinks freely, then its answer
matches the schema. The gate tracks, per request, whether the reasoning is still going on
and, for a run of tokens (a step's sampled tokens, or its drafts), where in it the grammar
takes over. It asks the parser's `is_reasoning_end` about the prompt once, then about each
new token, so a step costs a look at its own tokens only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["ReasoningGate"]

IsReasoningEnd = Callable[[Sequence[int]], bool]


class ReasoningGate:
    """Requests whose reasoning has not ended yet, and where it ends in a run of tokens.

    `is_reasoning_end(token_ids)` says whether the reasoning ends within `token_ids`, given
    that it had not ended before them (core.reasoning.ReasoningParser's contract).
    """

    def __init__(self, is_reasoning_end: IsReasoningEnd) -> None:
        self._is_reasoning_end = is_reasoning_end
        self._reasoning: set[str] = set()

    def add(self, request_id: str, prompt_token_ids: Sequence[int]) -> None:
        """Start tracking a request; a prompt that already ended the reasoning (a template
        that switched thinking off) leaves its grammar on from the first token."""
        if not self._is_reasoning_end(prompt_token_ids):
            self._reasoning.add(request_id)

    def remove(self, request_id: str) -> None:
        self._reasoning.discard(request_id)

    def grammar_start(self, request_id: str, token_ids: Sequence[int]) -> int | None:
        """Where the grammar takes over in `token_ids`, the request's next tokens: 0 when
        the reasoning had ended before them, the index after the token that ends it, or
        None when it goes on past them all (the token after them is free too)."""
        if request_id not in self._reasoning:
            return 0
        for i in range(len(token_ids)):
            if self._is_reasoning_end(token_ids[: i + 1]):
                return i + 1
        return None

    def advance(self, request_id: str, token_ids: Sequence[int]) -> int | None:
        """`grammar_start` of tokens the request has just accepted, and the gate moves past
        them: a reasoning that ended in them stays ended."""
        start = self.grammar_start(request_id, token_ids)
        if start is not None:
            self._reasoning.discard(request_id)
        return start
