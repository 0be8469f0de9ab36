"""The reasoning-parser extension point: telling a reasoning model's thinking from its answer.

Reasoning models (DeepSeek-R1, Qwen3) think before they answer, between markers such as
`<think>` and `</think>`. A ReasoningParser knows one model family's markers; the server
picks it with `--reasoning-parser NAME` (entry-point group `core.reasoning_parsers`,
value: the class). It serves two places:

- the frontend, which sends the thinking as `reasoning_content` apart from `content`
  (whole outputs through `extract_reasoning`, streams through a `ReasoningStream` over
  the parser, core.reasoning.stream);
- the engine core, where a structured-output request's grammar constrains only the tokens
  after the reasoning ends (`is_reasoning_end`), so the model thinks freely first.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar, NamedTuple

if TYPE_CHECKING:
    from core.tokenizer import Tokenizer

__all__ = ["ReasoningParser", "ReasoningSplit"]


class ReasoningSplit(NamedTuple):
    """An output's text (or a piece of it) split in two: the reasoning and the content,
    each None when empty. Markers belong to neither."""

    reasoning: str | None
    content: str | None


class ReasoningParser(ABC):
    """Splits a reasoning model's output into its reasoning and its content.

    Contract:
    - Built once per server or engine core with the model's tokenizer; a tokenizer that
      lacks the parser's markers is a ValueError saying which. The parser holds no
      per-request state: a stream keeps its own in a ReasoningStream.
    - `extract_reasoning(text)` splits a finished output. It is total (any text splits,
      never an exception) and prefix-stable: the split of a text extends the split of any
      prefix of it that does not end inside a marker (each part of the longer text starts
      with the same part of the shorter, None counting as ""). That is what lets a stream
      send each part as it grows and still add up to the split of the whole output.
    - `markers`: the parser's marker texts; a stream holds back a piece of text that could
      be the start of one until the next piece says whether it is.
    - `is_reasoning_end(token_ids)`: whether the reasoning has ended by the end of
      `token_ids`, given that it had not ended before them. The engine core asks it about
      a structured-output request's prompt, then about each new output token (and, to
      place a step's drafts, about their prefixes) until it says True; the request's
      grammar applies from the token after. It runs on the engine's step loop for every
      such token, so it looks only at the ids it is given, never a whole sequence, and its
      end marker is therefore a single token. An output whose reasoning never ends is
      never constrained.
    - `keeps_special_tokens`: True when the markers are special tokens, which the
      detokenizer must then keep in the text (the server sets skip_special_tokens=False).
    """

    markers: ClassVar[tuple[str, ...]] = ()

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.keeps_special_tokens = False

    @abstractmethod
    def extract_reasoning(self, text: str) -> ReasoningSplit:
        """The reasoning and the content of a finished output's text."""

    @abstractmethod
    def is_reasoning_end(self, token_ids: Sequence[int]) -> bool:
        """Whether the reasoning ended within `token_ids` (see the class contract)."""
