"""The tool-parser extension point: turning a model's output text into OpenAI tool calls.

Models write tool calls in their own markup (`<tool_call>{json}</tool_call>`,
`[TOOL_CALLS][...]`, `[f(x=1)]`...). A ToolParser recognizes one such format; the server
picks it with `--tool-call-parser NAME` (entry-point group `core.tool_parsers`, value: the
class) and uses it for requests whose `tool_choice` is "auto". Parsers see plain data only
(`ToolRequest`), never the HTTP layer's types, so a plugin depends on this module alone.
"""

from __future__ import annotations

import secrets
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from core.tokenizer import Tokenizer

__all__ = [
    "ExtractedToolCalls",
    "FunctionTool",
    "StreamedDelta",
    "ToolCall",
    "ToolCallDelta",
    "ToolParser",
    "ToolRequest",
    "new_tool_call_id",
]


@dataclass(frozen=True)
class FunctionTool:
    """One function a request offers the model (OpenAI's `tools[i].function`)."""

    name: str
    parameters: dict[str, Any] | None = None  # JSON schema of the arguments object
    description: str | None = None


@dataclass(frozen=True)
class ToolRequest:
    """What a parser may know about the request: the tools offered, and whether more than
    one call per answer is allowed (`parallel_tool_calls`)."""

    tools: tuple[FunctionTool, ...] = ()
    parallel_tool_calls: bool = True


@dataclass(frozen=True)
class ToolCall:
    """One call the model made. `arguments` is JSON text, as the model wrote it (OpenAI
    documents that it may be invalid JSON: clients validate it)."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ExtractedToolCalls:
    """The whole output, split: the calls, and the text that is not part of any call
    (None when that text is empty or only whitespace)."""

    tools_called: bool
    tool_calls: list[ToolCall]
    content: str | None


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of call number `index` in a stream. A call's first piece carries its `id`
    and `name` (and the arguments known so far, maybe ""); later pieces only the next
    fragment of `arguments`, as OpenAI streams them."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class StreamedDelta:
    """What to send for one step of a stream: new content text and call pieces."""

    content: str | None = None
    tool_calls: list[ToolCallDelta] = field(default_factory=list)


def new_tool_call_id() -> str:
    """An id in OpenAI's shape: "call_" and 24 hex digits."""
    return f"call_{secrets.token_hex(12)}"


class ToolParser(ABC):
    """Extracts the tool calls a model wrote in its output text, whole or streamed.

    Contract:
    - One instance per generated sequence (each choice of a request gets its own), built
      with the model's tokenizer: streaming keeps state between calls.
    - `extract_tool_calls(model_output, request)` parses a finished output. Text that is
      not part of a call is `content`; `tools_called` is true exactly when `tool_calls` is
      not empty. Malformed markup is content, never an exception.
    - `extract_tool_calls_streaming(current_text, delta_text, request, finished)` is called
      after each new piece of output (`delta_text`, ending `current_text`, the whole
      output so far), the last time with `finished=True`. It returns what to send now, or
      None when nothing is (text held back until it is known whether it starts a call).
      Over one sequence, the content pieces joined, and each call's name with its argument
      fragments joined, equal what `extract_tool_calls` returns for the final text (ids
      aside): a stream never says something the whole output would not.
    - `keeps_special_tokens`: True when the markup is made of special tokens, which the
      detokenizer must then keep in the text (the server sets skip_special_tokens=False).
    - When `request.parallel_tool_calls` is false, only the first call is reported.
    """

    keeps_special_tokens: ClassVar[bool] = False

    def __init__(self, tokenizer: Tokenizer | None = None) -> None:
        self.tokenizer = tokenizer

    def new_call_id(self) -> str:
        """The id of the next call this parser reports (formats may need their own shape)."""
        return new_tool_call_id()

    @abstractmethod
    def extract_tool_calls(self, model_output: str, request: ToolRequest) -> ExtractedToolCalls:
        """The calls and the content of a finished output."""

    @abstractmethod
    def extract_tool_calls_streaming(
        self, current_text: str, delta_text: str, request: ToolRequest, finished: bool
    ) -> StreamedDelta | None:
        """What to send after `delta_text` arrived (see the class contract)."""
