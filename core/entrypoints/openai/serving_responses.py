"""OpenAI's Responses API: POST /v1/responses, GET /v1/responses/{id} and
POST /v1/responses/{id}/cancel.

A request is served by the chat path (Serving): its conversation becomes a chat request,
rendered, planned for tools, sampled and run exactly as /v1/chat/completions would, so the
same greedy prompt gives the same text through either. The conversation is:

    instructions (a system message; a previous response's are not carried over)
    + the previous response's conversation and output (previous_response_id)
    + this request's input items

Input items become chat messages: a message as it is, ``function_call`` items the
assistant's tool calls (joined to the assistant message before them), a
``function_call_output`` a tool message; a ``reasoning`` item none (chat templates drop
past turns' reasoning, and chat clients do not send ``reasoning_content`` back, so the
prompt is the one chat completions would render). Under --reasoning-parser the output is
split as chat's is: a ``reasoning`` item, then the message and function calls of the
content. A chat-path error names the Responses field
(``messages`` -> ``input``, ``max_completion_tokens`` -> ``max_output_tokens``,
``response_format`` -> ``text.format``).

Each response runs as a ResponseRun. Stored (``store``, the default) it can be retrieved,
cancelled while in progress and continued from, until the ResponseStore lets it go; not
stored, it is known only to its own client. ``background``: the response is answered at
once, in progress, and runs on without a client (it must be stored, to be fetched).
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError

from core.entrypoints.openai import protocol as p
from core.entrypoints.openai.errors import OpenAIError, validation_error
from core.entrypoints.openai.protocol_responses import (
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionToolChoice,
    InputImagePart,
    InputMessage,
    OutputItem,
    OutputMessage,
    ReasoningItem,
    ResponseObject,
    ResponsesRequest,
)
from core.entrypoints.openai.reasoning import output_reasoning_parser
from core.entrypoints.openai.request_options import EngineRequestOptions
from core.entrypoints.openai.response_run import ResponseRun
from core.entrypoints.openai.response_store import ResponseStore
from core.entrypoints.openai.serving import Serving, TrackedRequest
from core.entrypoints.openai.tool_calls import ToolPlan
from core.lora.request import LoRARequest

__all__ = ["ServingResponses", "StoredResponse"]

Message = dict[str, Any]  # a chat message, as ChatMessageParam takes it

# The chat path's names for fields, and the Responses request's (in params and messages).
_RENAMES = (
    (re.compile(r"\bmessages(\[\d+\]|\.[a-z_]+)*"), "input"),
    (re.compile(r"\bmax_completion_tokens\b"), "max_output_tokens"),
    (re.compile(r"\bresponse_format\b"), "text.format"),
    (re.compile(r"\bstructured_outputs(\.json)?\b"), "text.format"),
    (re.compile(r"\btools(\[\d+\])\.function\b"), r"tools\1"),
)


@dataclass(frozen=True)
class StoredResponse:
    """What the store keeps of a response: its run (its state, and the handle that cancels
    it) and its conversation (the chat messages of its prompt, instructions aside)."""

    run: ResponseRun
    conversation: tuple[Message, ...]


class ServingResponses:
    def __init__(self, serving: Serving, store: ResponseStore[StoredResponse] | None = None):
        """`serving`: the chat path the requests are served by; `store`: where responses
        are kept (a new ResponseStore with its default bounds when None)."""
        self.serving = serving
        self.store: ResponseStore[StoredResponse] = store or ResponseStore()
        self._tasks: set[Any] = set()  # the runs' tasks: the event loop holds them weakly

    async def create(self, req: ResponsesRequest, raw: Request) -> Any:
        self.serving.engine.check_healthy()  # a 503 before a stream's 200
        lora = self.serving.check_model(req.model)
        self.serving.engine.processor.require_runner("generate")
        if req.background and req.store is False:
            raise OpenAIError(
                HTTPStatus.BAD_REQUEST,
                "background: a background response must be stored (store true), to be fetched",
                param="background",
            )
        conversation = (
            *self._previous_conversation(req.previous_response_id),
            *_chat_messages(req.items()),
        )
        response_id = f"resp_{uuid.uuid4().hex}"
        tracked, plan = await self._chat_path(req, conversation, lora, response_id)
        response = _new_response(req, response_id, self.serving.models.model_name(lora), tracked)
        prompt_ids = tracked.prepared.prompt_token_ids
        reasoning = output_reasoning_parser(self.serving.reasoning_parser, prompt_ids)
        run = ResponseRun(response, tracked, plan, bool(req.stream), reasoning)
        if response.store:
            self.store.add(response_id, StoredResponse(run, conversation))
        # A background response has no client to watch: nobody leaving stops it.
        task = run.start(self.serving.deltas([tracked], None if req.background else raw))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return await _answer(run, req)

    async def _chat_path(
        self,
        req: ResponsesRequest,
        conversation: tuple[Message, ...],
        lora: LoRARequest | None,
        response_id: str,
    ) -> tuple[TrackedRequest, ToolPlan]:
        """The engine request serving `req` over `conversation`, as the chat path makes it
        (its engine request id: `response_id`'s), and its tool plan."""
        chat = _chat_request(req, conversation)
        options = EngineRequestOptions(request_id=response_id)
        try:
            content, images = await self.serving.chat_content(chat)
            return await self.serving.offload.run(
                self.serving.chat_request, chat, content, images, lora, options
            )
        except OpenAIError as exc:
            raise _responses_error(exc) from exc

    async def retrieve(self, response_id: str) -> JSONResponse:
        return JSONResponse(self._stored(response_id).run.current().body())

    async def cancel(self, response_id: str) -> JSONResponse:
        """Cancel a response in progress (its engine request is aborted); a 400 for one that
        has ended."""
        run = self._stored(response_id).run
        if not run.in_progress:
            raise OpenAIError(
                HTTPStatus.BAD_REQUEST,
                f"Cannot cancel response '{response_id}': it is {run.response.status}, and "
                "only a response in progress can be cancelled.",
            )
        run.cancel()
        await run.wait()
        return JSONResponse(run.response.body())

    def _stored(self, response_id: str) -> StoredResponse:
        stored = self.store.get(response_id)
        if stored is None:
            raise OpenAIError(HTTPStatus.NOT_FOUND, f"Response with id '{response_id}' not found.")
        return stored

    def _previous_conversation(self, response_id: str | None) -> tuple[Message, ...]:
        """The conversation a request continues: the previous response's, then its output.
        A 404 naming previous_response_id when it is not stored, a 400 while it runs."""
        if response_id is None:
            return ()
        previous = self.store.get(response_id)
        if previous is None:
            raise OpenAIError(
                HTTPStatus.NOT_FOUND,
                f"Previous response with id '{response_id}' not found.",
                param="previous_response_id",
            )
        if previous.run.in_progress:
            raise OpenAIError(
                HTTPStatus.BAD_REQUEST,
                f"previous_response_id: response '{response_id}' is still in progress; "
                "continue from it once it has ended",
                param="previous_response_id",
            )
        output = previous.run.response.output
        return (*previous.conversation, *_chat_messages(output))


def _new_response(
    req: ResponsesRequest, response_id: str, model: str, tracked: TrackedRequest
) -> ResponseObject:
    """The response to `req`, in progress: the settings it runs with (the sampling ones as
    `tracked` runs them, defaults applied)."""
    params = tracked.prepared.params
    return ResponseObject(
        id=response_id,
        created_at=int(time.time()),
        status="in_progress",
        background=bool(req.background),
        model=model,
        instructions=req.instructions,
        max_output_tokens=req.max_output_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        tools=list(req.tools),
        tool_choice=req.tool_choice,
        parallel_tool_calls=req.parallel_tool_calls is not False,
        text=req.text,
        previous_response_id=req.previous_response_id,
        store=req.store is not False,
        metadata=req.metadata or {},
        user=req.user,
        safety_identifier=req.safety_identifier,
    )


async def _answer(run: ResponseRun, req: ResponsesRequest) -> Any:
    """The HTTP answer: the stream of events, the response in progress (background), or
    the whole response once it has ended (its error, if it failed)."""
    if req.stream:
        events = _stream(run, cancel_on_leave=not req.background)
        return StreamingResponse(events, media_type="text/event-stream")
    if req.background:
        return JSONResponse(run.current().body())
    await run.wait()
    if run.error is not None:
        raise run.error
    return JSONResponse(run.response.body())


async def _stream(run: ResponseRun, cancel_on_leave: bool) -> AsyncIterator[str]:
    """The run's events; when the client leaves before the last, the response is cancelled
    (`cancel_on_leave`), or runs on without keeping its events (a background one)."""
    ended = False
    try:
        async for event in run.stream():
            yield event
        ended = True
    finally:
        if not ended:
            run.stop_streaming()
            if cancel_on_leave:
                run.cancel()


# --- a Responses request as a chat request --------------------------------------------------


def _chat_request(
    req: ResponsesRequest, conversation: Iterable[Message]
) -> p.ChatCompletionRequest:
    """The chat request that serves `req` over `conversation`; a 400 naming the Responses
    field that the chat request's validation refuses."""
    instructions = [{"role": "system", "content": req.instructions}] if req.instructions else []
    body: dict[str, Any] = {
        "model": req.model,
        "messages": [*instructions, *conversation],
        "max_completion_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "parallel_tool_calls": req.parallel_tool_calls,
        "response_format": req.text.format.response_format(),
    }
    if req.tools:
        body["tools"] = [tool.chat_tool() for tool in req.tools]
    # "auto" is the Responses default, with or without tools; the chat path's default is
    # "auto" with tools and "none" without, so it is left to it.
    if req.tool_choice != "auto":
        body["tool_choice"] = _chat_tool_choice(req.tool_choice)
    try:
        return p.ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        raise _responses_error(validation_error(exc.errors())) from exc


def _chat_tool_choice(choice: str | FunctionToolChoice) -> str | dict[str, Any]:
    if isinstance(choice, str):
        return choice
    return {"type": "function", "function": {"name": choice.name}}


def _chat_messages(
    items: Iterable[InputMessage | FunctionCallItem | FunctionCallOutputItem | OutputItem],
) -> list[Message]:
    """Input items, or a previous response's output items, as chat messages (reasoning
    items left out: chat templates drop past reasoning)."""
    messages: list[Message] = []
    for item in items:
        if isinstance(item, ReasoningItem):
            continue
        if isinstance(item, FunctionCallItem):
            _add_call(messages, item)
        elif isinstance(item, FunctionCallOutputItem):
            messages.append(
                {"role": "tool", "tool_call_id": item.call_id, "content": item.output_text()}
            )
        elif isinstance(item, OutputMessage):
            text = "".join(part.text for part in item.content)
            messages.append({"role": "assistant", "content": text})
        else:
            messages.append({"role": item.role, "content": _chat_content(item)})
    return messages


def _add_call(messages: list[Message], item: FunctionCallItem) -> None:
    """The call joins the assistant message it follows (calls of one turn are one message),
    or starts one; a new dict either way: earlier messages may be a stored conversation's."""
    call = {
        "id": item.call_id,
        "type": "function",
        "function": {"name": item.name, "arguments": item.arguments},
    }
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant":
        messages[-1] = {**last, "tool_calls": [*(last.get("tool_calls") or []), call]}
    else:
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _chat_content(message: InputMessage) -> str | list[dict[str, Any]]:
    if isinstance(message.content, str):
        return message.content
    parts: list[dict[str, Any]] = []
    for part in message.content:
        if isinstance(part, InputImagePart):
            image = {"type": "input_image", "image_url": part.image_url, "detail": part.detail}
            parts.append({k: v for k, v in image.items() if v is not None})
        else:
            parts.append({"type": "text", "text": part.text})
    return parts


def _responses_error(exc: OpenAIError) -> OpenAIError:
    """`exc` of the chat path, naming the Responses request's fields instead."""
    message, param = exc.message, exc.param
    for pattern, name in _RENAMES:
        message = pattern.sub(name, message)
        param = pattern.sub(name, param) if param is not None else None
    return OpenAIError(exc.status, message, exc.type, param, exc.code)
