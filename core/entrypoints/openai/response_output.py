"""A response's output items, assembled from its sample's deltas, and the stream events
that announce each step of them.

This is the one place where output items are made, streamed or not (a whole response is
the same assembly with its events dropped), so a stream never says something the final
response does not. Text becomes a ``message`` item with one ``output_text`` part; each tool
call the request's ToolPlan reads out of the text (core.entrypoints.openai.tool_calls)
becomes a ``function_call`` item, in the order the model wrote them. An item is open while
the model writes it and closed (its ``.done`` events) when the next one starts or the
response ends.

Under --reasoning-parser each piece is split first, as chat completions split it
(core.entrypoints.openai.reasoning's `split_delta`, over a ReasoningStream): its reasoning
goes to a ``reasoning`` item with one ``reasoning_text`` part (streamed as
response.reasoning_text.delta / .done), and only the rest is the message's text and is
read for tool calls. The stream's pieces add up to the parser's split of the whole text,
so the items are those of a chat completion's ``reasoning_content`` and ``content``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass

from core.entrypoints.openai import protocol as p
from core.entrypoints.openai.protocol_responses import (
    FunctionCallItem,
    ItemStatus,
    OutputItem,
    OutputMessage,
    OutputText,
    ReasoningItem,
    ReasoningText,
)
from core.entrypoints.openai.reasoning import split_delta
from core.entrypoints.openai.response_events import (
    ArgumentsDeltaEvent,
    ArgumentsDoneEvent,
    ContentPartEvent,
    OutputItemEvent,
    ReasoningTextDeltaEvent,
    ReasoningTextDoneEvent,
    StreamEvent,
    TextDeltaEvent,
    TextDoneEvent,
)
from core.entrypoints.openai.tool_calls import ToolStream
from core.outputs import CompletionOutput
from core.reasoning import ReasoningParser, ReasoningStream
from core.tool_parsers import new_tool_call_id

__all__ = ["ResponseOutput"]

TextItem = OutputMessage | ReasoningItem  # an item whose content is one text part


@dataclass(frozen=True)
class _TextKind:
    """A kind of text item: how a new one and its part are made, and the events that carry
    its text."""

    new_item: Callable[[], TextItem]
    new_part: Callable[[], OutputText | ReasoningText]
    delta_event: type[TextDeltaEvent | ReasoningTextDeltaEvent]
    done_event: type[TextDoneEvent | ReasoningTextDoneEvent]


_MESSAGE = _TextKind(
    lambda: OutputMessage(id=f"msg_{uuid.uuid4().hex}"),
    OutputText,
    TextDeltaEvent,
    TextDoneEvent,
)
_REASONING = _TextKind(
    lambda: ReasoningItem(
        id=f"rs_{uuid.uuid4().hex}", summary=[], content=[], status="in_progress"
    ),
    ReasoningText,
    ReasoningTextDeltaEvent,
    ReasoningTextDoneEvent,
)
_TEXT_KINDS: dict[type, _TextKind] = {OutputMessage: _MESSAGE, ReasoningItem: _REASONING}


class ResponseOutput:
    """The output items of one sample, built delta by delta. `tools` reads tool calls out
    of the content (the sample's ToolStream); None: the content is the message.
    `reasoning` splits the reasoning off first (the parser of output_reasoning_parser);
    None: the text is all content. The item being written is always the last one."""

    def __init__(self, tools: ToolStream | None, reasoning: ReasoningParser | None = None):
        self._tools = tools
        self._reasoning = None if reasoning is None else ReasoningStream(reasoning)
        self.items: list[OutputItem] = []
        self._writing = False  # whether the last item is still open
        self._call_items: dict[int, int] = {}  # the parser's call index -> output index

    @property
    def has_reasoning(self) -> bool:
        """Whether the output has a reasoning item (a reasoning that was not empty)."""
        return any(isinstance(item, ReasoningItem) for item in self.items)

    def add(self, sample: CompletionOutput) -> list[StreamEvent]:
        """Take the sample's newest piece; the events announcing what it changed."""
        reasoning, content, calls = self._read(sample)
        events = self._add_text(_REASONING, reasoning) if reasoning else []
        if content:
            events += self._add_text(_MESSAGE, content)
        for call in calls:
            events += self._add_call(call)
        return events

    def close(self, status: ItemStatus) -> list[StreamEvent]:
        """Close the item being written with `status`; the events saying so."""
        if not self._writing:
            return []
        self._writing = False
        index, item = len(self.items) - 1, self.items[-1]
        item.status = status
        done = OutputItemEvent(
            type="response.output_item.done", output_index=index, item=item.model_copy(deep=True)
        )
        if isinstance(item, FunctionCallItem):
            arguments = ArgumentsDoneEvent(
                item_id=item.id, output_index=index, name=item.name, arguments=item.arguments
            )
            return [arguments, done]
        part = _part(item)
        text_done = _TEXT_KINDS[type(item)].done_event
        return [
            text_done(item_id=item.id, output_index=index, content_index=0, text=part.text),
            ContentPartEvent(
                type="response.content_part.done",
                item_id=item.id,
                output_index=index,
                content_index=0,
                part=part.model_copy(),
            ),
            done,
        ]

    def _read(self, sample: CompletionOutput) -> tuple[str, str, list[p.DeltaToolCall]]:
        """The piece's reasoning, content and tool calls (the calls read from the content)."""
        reasoning = None
        if self._reasoning is not None:
            reasoning, sample = split_delta(self._reasoning, sample)
        if self._tools is None:
            return reasoning or "", sample.text, []
        delta, _ = self._tools.step(sample)
        return reasoning or "", delta.content or "", delta.tool_calls or []

    def _add_text(self, kind: _TextKind, text: str) -> list[StreamEvent]:
        """`text` added to the open item of `kind`, or to a new one (closing the open one)."""
        events: list[StreamEvent] = []
        item = self.items[-1] if self._writing else None
        if _TEXT_KINDS.get(type(item)) is not kind:
            events += self.close("completed")
            item = kind.new_item()
            events += self._open_text(item, kind)
        _part(item).text += text
        index = len(self.items) - 1
        events.append(
            kind.delta_event(item_id=item.id, output_index=index, content_index=0, delta=text)
        )
        return events

    def _open_text(self, item: TextItem, kind: _TextKind) -> list[StreamEvent]:
        index = self._start(item)
        added: list[StreamEvent] = [
            OutputItemEvent(
                type="response.output_item.added",
                output_index=index,
                item=item.model_copy(deep=True),
            ),
            ContentPartEvent(
                type="response.content_part.added",
                item_id=item.id,
                output_index=index,
                content_index=0,
                part=kind.new_part(),
            ),
        ]
        item.content.append(kind.new_part())  # type: ignore[union-attr]  # new: a list
        return added

    def _add_call(self, call: p.DeltaToolCall) -> list[StreamEvent]:
        """A piece of call `call.index`: its first names it (a new item), every one may
        carry a fragment of its arguments."""
        events: list[StreamEvent] = []
        index = self._call_items.get(call.index)
        if index is None:
            events += self.close("completed")
            index = self._start(_new_call(call))
            self._call_items[call.index] = index
            item = self.items[index].model_copy(deep=True)
            events.append(
                OutputItemEvent(type="response.output_item.added", output_index=index, item=item)
            )
        item = self.items[index]
        fragment = call.function.arguments if call.function is not None else None
        if fragment and isinstance(item, FunctionCallItem):
            item.arguments += fragment
            events.append(ArgumentsDeltaEvent(item_id=item.id, output_index=index, delta=fragment))
        return events

    def _start(self, item: OutputItem) -> int:
        self.items.append(item)
        self._writing = True
        return len(self.items) - 1


def _part(item: TextItem) -> OutputText | ReasoningText:
    """The one text part of an item that `_open_text` opened."""
    return item.content[0]  # type: ignore[index]  # a list: _open_text made it


def _new_call(call: p.DeltaToolCall) -> FunctionCallItem:
    """The item of a call, from its first piece (which carries its id and name)."""
    name = call.function.name if call.function is not None else None
    return FunctionCallItem(
        id=f"fc_{uuid.uuid4().hex}",
        call_id=call.id or new_tool_call_id(),
        name=name or "",
        arguments="",
        status="in_progress",
    )
