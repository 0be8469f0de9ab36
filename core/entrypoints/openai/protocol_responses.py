"""Request, response and stream-event bodies of OpenAI's Responses API (/v1/responses).

A request is served through the chat path (``serving_responses``): its input items become
chat messages, its function tools chat tools, ``text.format`` a response_format. What it
may hold:

- input items: messages (``role`` and ``content``: a string or ``input_text`` /
  ``input_image`` / ``output_text`` parts), ``function_call`` items,
  ``function_call_output`` items (a client sending a tool's result back) and ``reasoning``
  items (a previous output sent back; left out of the prompt, as chat templates drop past
  reasoning). Any other item or part type is refused naming it.
- tools: ``function`` tools only. Hosted tools (web_search_preview, file_search,
  code_interpreter, computer_use_preview, image_generation, mcp, ...) need services this
  server does not run: each is a 400 naming its type.
- Responses fields this server knows but does not implement (``RESPONSES_UNSUPPORTED``)
  are a 400 naming the field when set to anything but their "off" value, never ignored.

Request models inherit ``protocol._Request`` and so its policy for fields
(``request_fields``: unknown ones are ignored with a warning).
Response models are dumped with their nulls, as OpenAI writes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    Discriminator,
    Field,
    Tag,
    field_serializer,
    field_validator,
    model_validator,
)

from core.entrypoints.openai.protocol import FunctionDefinition, _Request, _Response
from core.entrypoints.openai.request_fields import Unsupported

# OpenAI's limits on `metadata`: 16 pairs, keys up to 64 characters, values up to 512.
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512

ItemStatus = Literal["in_progress", "completed", "incomplete"]
ResponseStatus = Literal["completed", "failed", "in_progress", "cancelled", "queued", "incomplete"]


class _Refused(BaseModel):
    """The union member of the types not supported: refuses any value, naming its
    ``type`` (`what` is the kind of thing, `accepted` what is taken instead). Not a
    _Request: it validates no field, so it has none to warn about."""

    what: ClassVar[str]
    accepted: ClassVar[str]

    @model_validator(mode="before")
    @classmethod
    def _refuse(cls, value: Any) -> Any:
        found = value.get("type") if isinstance(value, dict) else None
        raise ValueError(f"{cls.what} type {found!r} is not supported ({cls.accepted})")


def _tagged(tags: dict[str, str], refused: str, default: str | None = None) -> Any:
    """A discriminator over ``type`` (``default`` when a dict has none): each known type
    its model's tag, any other type the refusing model's."""

    def tag(value: Any) -> str:
        kind = (
            value.get("type", default) if isinstance(value, dict) else getattr(value, "type", None)
        )
        return tags.get(kind, refused) if isinstance(kind, str) else refused

    return Discriminator(tag)


def _text_or_list_tag(value: Any) -> str | None:
    if isinstance(value, str):
        return "Text"
    return "List" if isinstance(value, list) else None


def _text_or_list(item: Any, message: str) -> Any:
    """A string or a list of `item`, checked as the one its JSON type says: an error names
    the item at fault only, without "should be a string" from the union's other member."""
    return Annotated[
        Annotated[str, Tag("Text")] | Annotated[list[item], Tag("List")],
        Discriminator(
            _text_or_list_tag, custom_error_type="text_or_list", custom_error_message=message
        ),
    ]


# --- input items ---------------------------------------------------------------------------


class InputTextPart(_Request):
    type: Literal["input_text"]
    text: str


class OutputTextPart(_Request):
    """An assistant message's text, as a previous response's output sends it back."""

    type: Literal["output_text"]
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] | None = None


class InputImagePart(_Request):
    unsupported_fields = {"file_id": Unsupported("this server has no file store; send image_url")}
    type: Literal["input_image"]
    image_url: str
    detail: Literal["auto", "low", "high"] | None = None


class _RefusedPart(_Refused):
    what = "content part"
    accepted = "input_text, input_image, output_text"


InputContentPart = Annotated[
    Annotated[InputTextPart, Tag("InputTextPart")]
    | Annotated[OutputTextPart, Tag("OutputTextPart")]
    | Annotated[InputImagePart, Tag("InputImagePart")]
    | Annotated[_RefusedPart, Tag("_RefusedPart")],
    _tagged(
        {
            "input_text": "InputTextPart",
            "output_text": "OutputTextPart",
            "input_image": "InputImagePart",
        },
        "_RefusedPart",
    ),
]


MessageContent = _text_or_list(InputContentPart, "content must be a string or a list of parts")
ToolOutput = _text_or_list(InputTextPart, "output must be a string or a list of input_text parts")


class InputMessage(_Request):
    """A message of the conversation (``type`` may be left out, as OpenAI allows)."""

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: MessageContent
    id: str | None = None
    status: ItemStatus | None = None


class FunctionCallItem(_Request):
    """A call the model made: an output item, and an input item when sent back."""

    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    arguments: str  # JSON text
    id: str | None = None
    status: ItemStatus | None = None


class FunctionCallOutputItem(_Request):
    """A tool's result, answering the call `call_id`."""

    type: Literal["function_call_output"]
    call_id: str
    output: ToolOutput
    id: str | None = None
    status: ItemStatus | None = None

    def output_text(self) -> str:
        if isinstance(self.output, str):
            return self.output
        return "".join(part.text for part in self.output)


class SummaryText(_Request):
    type: Literal["summary_text"] = "summary_text"
    text: str


class ReasoningText(_Request):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str = ""


class ReasoningItem(_Request):
    """What the model thought before its answer (the server's --reasoning-parser split it
    off): an output item, and an input item when sent back. Its text is one
    ``reasoning_text`` part; core writes no summaries and encrypts nothing."""

    unsupported_fields = {
        "encrypted_content": Unsupported(
            "this server encrypts no reasoning; send the item's content instead"
        )
    }
    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list[SummaryText]
    content: list[ReasoningText] | None = None
    status: ItemStatus | None = None


class _RefusedItem(_Refused):
    what = "input item"
    accepted = "message, function_call, function_call_output, reasoning"


InputItem = Annotated[
    Annotated[InputMessage, Tag("InputMessage")]
    | Annotated[FunctionCallItem, Tag("FunctionCallItem")]
    | Annotated[FunctionCallOutputItem, Tag("FunctionCallOutputItem")]
    | Annotated[ReasoningItem, Tag("ReasoningItem")]
    | Annotated[_RefusedItem, Tag("_RefusedItem")],
    _tagged(
        {
            "message": "InputMessage",
            "function_call": "FunctionCallItem",
            "function_call_output": "FunctionCallOutputItem",
            "reasoning": "ReasoningItem",
        },
        "_RefusedItem",
        default="message",
    ),
]


ResponseInput = _text_or_list(InputItem, "input must be a string or a list of input items")


# --- tools and text format -----------------------------------------------------------------


class FunctionTool(FunctionDefinition):
    """A ``function`` tool: the chat API's function definition, flat."""

    type: Literal["function"]

    def chat_tool(self) -> dict[str, Any]:
        """The tool as the chat API's ``tools`` entry."""
        return {
            "type": "function",
            "function": self.model_dump(exclude={"type"}, exclude_none=True),
        }


class _RefusedTool(_Refused):
    what = "tool"
    accepted = "this server runs no hosted tools, only tools of type 'function'"


Tool = Annotated[
    Annotated[FunctionTool, Tag("FunctionTool")] | Annotated[_RefusedTool, Tag("_RefusedTool")],
    _tagged({"function": "FunctionTool"}, "_RefusedTool"),
]


class FunctionToolChoice(_Request):
    """``tool_choice`` naming the function the model must call."""

    type: Literal["function"]
    name: str


class _RefusedToolChoice(_Refused):
    what = "tool_choice"
    accepted = "'none', 'auto', 'required' or {'type': 'function', 'name': ...}"


def _tool_choice_tag(value: Any) -> str:
    if isinstance(value, str):
        return "Mode"
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return "FunctionToolChoice" if kind == "function" else "_RefusedToolChoice"


ToolChoice = Annotated[
    Annotated[Literal["none", "auto", "required"], Tag("Mode")]
    | Annotated[FunctionToolChoice, Tag("FunctionToolChoice")]
    | Annotated[_RefusedToolChoice, Tag("_RefusedToolChoice")],
    Discriminator(_tool_choice_tag),
]


class TextFormat(_Request):
    """``text.format``: plain text, any JSON object, or JSON under a schema."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_iff_json_schema(self) -> TextFormat:
        if (self.type == "json_schema") != (self.schema_ is not None):
            raise ValueError("schema must be set exactly when type is 'json_schema'")
        if self.type == "json_schema" and self.name is None:
            raise ValueError("name is required when type is 'json_schema'")
        return self

    def response_format(self) -> dict[str, Any] | None:
        """The chat API's ``response_format`` for this format (None: plain text)."""
        if self.type == "text":
            return None
        if self.type == "json_object":
            return {"type": "json_object"}
        schema = {"name": self.name, "schema": self.schema_}
        schema |= {
            k: v
            for k, v in (("description", self.description), ("strict", self.strict))
            if v is not None
        }
        return {"type": "json_schema", "json_schema": schema}


class TextConfig(_Request):
    unsupported_fields = {
        "verbosity": Unsupported("verbosity is not implemented", (None, "medium"))
    }
    format: TextFormat = Field(default_factory=lambda: TextFormat(type="text"))


# --- the request ---------------------------------------------------------------------------

_OFF_OBFUSCATION = (None, {}, {"include_obfuscation": False})

RESPONSES_UNSUPPORTED: Mapping[str, Unsupported] = {
    "include": Unsupported(
        "no extra output data (logprobs, encrypted reasoning, tool sources) is included",
        (None, []),
    ),
    "reasoning": Unsupported("reasoning options are not implemented"),
    "truncation": Unsupported(
        "an input is never truncated; send a shorter one", (None, "disabled")
    ),
    "top_logprobs": Unsupported("output logprobs are not implemented", (None, 0)),
    "max_tool_calls": Unsupported("it counts hosted tools' calls, and this server runs none"),
    "prompt": Unsupported("stored prompt templates are not implemented; send input"),
    "conversation": Unsupported("conversations are not stored; continue with previous_response_id"),
    "context_management": Unsupported("context compaction is not implemented"),
    "moderation": Unsupported("moderation is not implemented"),
    "prompt_cache_key": Unsupported(
        "the prefix cache needs no key (identical prefixes share it by themselves)"
    ),
    "prompt_cache_retention": Unsupported("the prefix cache promises no retention"),
    "prompt_cache_options": Unsupported("the prefix cache takes no options"),
    "service_tier": Unsupported("there is one service tier", (None, "auto", "default")),
    "stream_options": Unsupported("stream obfuscation is not implemented", _OFF_OBFUSCATION),
}
"""The Responses fields this server knows and refuses (ResponsesRequest.unsupported_fields;
the policy: core.entrypoints.openai.request_fields)."""


class ResponsesRequest(_Request):
    """POST /v1/responses."""

    unsupported_fields = RESPONSES_UNSUPPORTED
    model: str | None = None
    input: ResponseInput
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[Tool] = Field(default_factory=list)
    tool_choice: ToolChoice = "auto"
    parallel_tool_calls: bool | None = True
    text: TextConfig = Field(default_factory=TextConfig)
    previous_response_id: str | None = None
    store: bool | None = True  # None: OpenAI's default, stored
    stream: bool | None = False
    background: bool | None = False
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None

    @field_validator("metadata")
    @classmethod
    def _metadata_limits(cls, metadata: dict[str, str] | None) -> dict[str, str] | None:
        if metadata is None:
            return None
        if len(metadata) > MAX_METADATA_PAIRS:
            raise ValueError(f"at most {MAX_METADATA_PAIRS} key-value pairs")
        for key, value in metadata.items():
            if len(key) > MAX_METADATA_KEY_CHARS:
                raise ValueError(f"key {key[:20]!r}... is over {MAX_METADATA_KEY_CHARS} characters")
            if len(value) > MAX_METADATA_VALUE_CHARS:
                raise ValueError(
                    f"the value of {key!r} is over {MAX_METADATA_VALUE_CHARS} characters"
                )
        return metadata

    def items(
        self,
    ) -> list[InputMessage | FunctionCallItem | FunctionCallOutputItem | ReasoningItem]:
        """The input as items: a string is one user message."""
        if isinstance(self.input, str):
            return [InputMessage(role="user", content=self.input)]
        return list(self.input)  # type: ignore[arg-type]  # _RefusedItem never validates


# --- output items and the response ---------------------------------------------------------


class OutputText(_Response):
    type: Literal["output_text"] = "output_text"
    text: str = ""
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] | None = None


class OutputMessage(_Response):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: ItemStatus = "in_progress"
    content: list[OutputText] = Field(default_factory=list)


OutputItem = ReasoningItem | OutputMessage | FunctionCallItem


class InputTokensDetails(_Response):
    cached_tokens: int = 0


class OutputTokensDetails(_Response):
    reasoning_tokens: int = 0


class ResponseUsage(_Response):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class ResponseError(_Response):
    code: str
    message: str


class IncompleteDetails(_Response):
    reason: Literal["max_output_tokens"]


class ResponseObject(_Response):
    """A response, at any point of its life: the settings it was asked with, echoed."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: ResponseStatus
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    background: bool
    model: str
    output: list[OutputItem] = Field(default_factory=list)
    usage: ResponseUsage | None = None
    instructions: str | None
    max_output_tokens: int | None
    temperature: float | None
    top_p: float | None
    tools: list[FunctionTool]
    tool_choice: str | FunctionToolChoice
    parallel_tool_calls: bool
    text: TextConfig
    previous_response_id: str | None
    store: bool
    metadata: dict[str, str]
    user: str | None
    safety_identifier: str | None
    truncation: Literal["disabled"] = "disabled"
    reasoning: None = None

    @field_serializer("text")
    def _text_as_sent(self, text: TextConfig) -> dict[str, Any]:
        # {"format": {"type": "text"}}, not a null for each field a schema format has
        return text.model_dump(mode="json", by_alias=True, exclude_none=True)

    def body(self) -> dict[str, Any]:
        """The JSON body, nulls included (OpenAI's shape)."""
        return self.model_dump(mode="json", by_alias=True)
