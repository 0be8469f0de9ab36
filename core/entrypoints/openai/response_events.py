"""The Server-Sent Events of a streamed response, with OpenAI's names and payloads.

A text answer streams response.created, response.in_progress, then for its message item
response.output_item.added, response.content_part.added, response.output_text.delta (one
per piece), response.output_text.done, response.content_part.done,
response.output_item.done, and last response.completed (or .incomplete, .failed). A
reasoning item, before the message, streams the same way with a ``reasoning_text`` part
and response.reasoning_text.delta / .done. A function_call item streams
response.output_item.added, response.function_call_arguments.delta / .done and
response.output_item.done. Events carry `type` and `sequence_number` (from 0); each is
sent as ``event: TYPE`` and ``data: JSON``.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field

from core.entrypoints.openai.protocol import _Response
from core.entrypoints.openai.protocol_responses import (
    OutputItem,
    OutputText,
    ReasoningText,
    ResponseObject,
)


class StreamEvent(_Response):
    """One Server-Sent Event of a streamed response; the stream numbers them from 0."""

    type: str
    sequence_number: int = 0

    def sse(self) -> str:
        """The event as the stream sends it."""
        body = json.dumps(self.model_dump(mode="json", by_alias=True), ensure_ascii=False)
        return f"event: {self.type}\ndata: {body}\n\n"


class ResponseEvent(StreamEvent):
    """response.created / in_progress / completed / incomplete / failed."""

    response: ResponseObject


class OutputItemEvent(StreamEvent):
    """response.output_item.added / done."""

    output_index: int
    item: OutputItem


class ContentPartEvent(StreamEvent):
    """response.content_part.added / done."""

    item_id: str
    output_index: int
    content_index: int
    part: OutputText | ReasoningText


class _PartDeltaEvent(StreamEvent):
    """A piece of a text part's text."""

    item_id: str
    output_index: int
    content_index: int
    delta: str


class _PartDoneEvent(StreamEvent):
    """A text part's whole text, once written."""

    item_id: str
    output_index: int
    content_index: int
    text: str


class TextDeltaEvent(_PartDeltaEvent):
    type: str = "response.output_text.delta"
    logprobs: list[Any] = Field(default_factory=list)


class TextDoneEvent(_PartDoneEvent):
    type: str = "response.output_text.done"
    logprobs: list[Any] = Field(default_factory=list)


class ReasoningTextDeltaEvent(_PartDeltaEvent):
    type: str = "response.reasoning_text.delta"


class ReasoningTextDoneEvent(_PartDoneEvent):
    type: str = "response.reasoning_text.done"


class ArgumentsDeltaEvent(StreamEvent):
    type: str = "response.function_call_arguments.delta"
    item_id: str
    output_index: int
    delta: str


class ArgumentsDoneEvent(StreamEvent):
    type: str = "response.function_call_arguments.done"
    item_id: str
    output_index: int
    name: str
    arguments: str


class ErrorEvent(StreamEvent):
    """The stream's last event when it ends without a response event (cancelled)."""

    type: str = "error"
    code: str
    message: str
    param: str | None = None
