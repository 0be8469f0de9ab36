"""The shared part of parsers whose models think between `<think>` and `</think>` tokens."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

from core.reasoning.interface import ReasoningParser

if TYPE_CHECKING:
    from core.tokenizer import Tokenizer

__all__ = ["ThinkTagReasoningParser"]


class ThinkTagReasoningParser(ReasoningParser):
    """Markers `<think>` and `</think>`, each one token of the vocabulary (the engine core
    finds the end of the reasoning by its token id). Subclasses say how text splits."""

    start_tag: ClassVar[str] = "<think>"
    end_tag: ClassVar[str] = "</think>"
    markers = (start_tag, end_tag)

    def __init__(self, tokenizer: Tokenizer) -> None:
        super().__init__(tokenizer)
        self.start_token_id = self._token_id(self.start_tag)
        self.end_token_id = self._token_id(self.end_tag)
        added = tokenizer.backend_tokenizer.get_added_tokens_decoder()
        self.keeps_special_tokens = any(
            token_id in added and added[token_id].special
            for token_id in (self.start_token_id, self.end_token_id)
        )

    def _token_id(self, tag: str) -> int:
        token_id = self.tokenizer.backend_tokenizer.token_to_id(tag)
        if token_id is None:
            raise ValueError(f"the tokenizer has no {tag!r} token (this parser's marker)")
        return token_id

    def is_reasoning_end(self, token_ids: Sequence[int]) -> bool:
        # The last marker decides: a prompt may hold earlier turns' closed reasoning, and
        # still open a new one at its end.
        for token_id in reversed(token_ids):
            if token_id == self.end_token_id:
                return True
            if token_id == self.start_token_id:
                return False
        return False
