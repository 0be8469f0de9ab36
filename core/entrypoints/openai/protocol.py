"""Request and response bodies of the OpenAI-compatible API.

Requests follow OpenAI's field names plus vLLM's extra sampling fields. Unknown fields
are ignored with a logged warning (clients send fields this server does not know, as they
do to OpenAI), a field of vLLM's or OpenAI's protocol that core does not implement is
refused unless sent with its "off" value (each model's ``unsupported_fields``; the policy
is ``request_fields``, run for every request model), and a known field of the wrong type
is rejected: request models are strict, so ``"16"`` is not
a ``max_tokens`` and ``true`` is not an ``n``. Range checks that SamplingParams already
makes (temperature, top_p, penalties, ...) are left to it (see ``params``); only OpenAI's
own limits (``logprobs`` and ``top_logprobs`` in [0, 20]) and rules between fields are
checked here. A sampling field left as None means "not set": the model's
generation_config default, else SamplingParams' default, applies.

Every field of every request, whatever its type, is also checked as data from outside
(``core.input_checks``): its text must be valid Unicode (JSON can carry a lone surrogate,
``"\\ud800"``, that nothing downstream can encode) and its JSON data nest at most
MAX_JSON_DEPTH levels; either is a 400 naming the field, before anything else runs.

Response models are built from RequestOutputs by the helpers in ``responses``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    ModelWrapValidatorHandler,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)

from core.entrypoints.openai.request_fields import (
    CHAT_UNSUPPORTED,
    COMPLETION_UNSUPPORTED,
    STREAM_OPTIONS_UNSUPPORTED,
    Unsupported,
    refuse_unsupported,
    warn_unknown,
)
from core.input_checks import check_json_data

# OpenAI's cap on logprobs (completions) and top_logprobs (chat).
MAX_TOP_LOGPROBS = 20


TokenId = Annotated[int, Field(ge=0)]


class _Request(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    # Known fields this server does not implement: refused unless "off" (request_fields).
    unsupported_fields: ClassVar[Mapping[str, Unsupported]] = {}

    @model_validator(mode="wrap")
    @classmethod
    def _honoured_or_refused(cls, data: Any, handler: ModelWrapValidatorHandler) -> Any:
        refuse_unsupported(cls, data)
        validated = handler(data)
        warn_unknown(cls, data)
        return validated

    @field_validator("*")
    @classmethod
    def _outside_data(cls, value: Any) -> Any:
        # Nested request models are checked by their own fields; the walk skips them.
        check_json_data(value, "")
        return value


class _Response(BaseModel):
    pass


def _new_id(prefix: str) -> Any:
    return Field(default_factory=lambda: f"{prefix}-{uuid.uuid4().hex}")


def _now() -> Any:
    return Field(default_factory=lambda: int(time.time()))


# --- request parts -------------------------------------------------------------------------


class StreamOptions(_Request):
    unsupported_fields = STREAM_OPTIONS_UNSUPPORTED
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM: usage on every chunk


class JsonSchemaFormat(_Request):
    name: str
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(_Request):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_iff_json_schema(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema must be set exactly when type is 'json_schema'")
        return self


class StructuredOutputsRequest(_Request):
    """vLLM's ``structured_outputs`` field; exactly one constraint (checked by
    StructuredOutputsParams)."""

    json_: str | dict[str, Any] | None = Field(default=None, alias="json")
    json_object: bool | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None


class TextContentPart(_Request):
    type: Literal["text"]
    text: str


class ImageURL(_Request):
    url: str  # data:, file: (under --allowed-local-media-path) or http(s): (core.multimodal.media)
    detail: Literal["auto", "low", "high"] | None = None  # OpenAI's; images are used as sent


class ImageURLContentPart(_Request):
    type: Literal["image_url"]
    image_url: ImageURL

    @field_validator("image_url", mode="before")
    @classmethod
    def _bare_url(cls, value: Any) -> Any:
        # vLLM takes the URL itself as well as OpenAI's {"url": ...}.
        return {"url": value} if isinstance(value, str) else value


class InputImageContentPart(_Request):
    """The Responses API's image part: ``image_url`` is the URL itself."""

    type: Literal["input_image"]
    image_url: str
    detail: Literal["auto", "low", "high"] | None = None


class RefusedContentPart(_Request):
    """A part of a type the server does not take: refused naming its type (``image_embeds``:
    core encodes images itself, from the images)."""

    @model_validator(mode="before")
    @classmethod
    def _refuse(cls, part: Any) -> Any:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "image_embeds":
            raise ValueError("image_embeds is not supported; send the image (image_url)")
        raise ValueError(
            f"content part type {kind!r} is not supported (text, image_url, input_image)"
        )


# The model validating each content part type; any other type is refused. Tags are class
# names, so error paths skip them (``messages[0].content[1].text``, see errors._field_path).
_PART_TAGS = {
    "text": "TextContentPart",
    "image_url": "ImageURLContentPart",
    "input_image": "InputImageContentPart",
}


def _part_tag(part: Any) -> str:
    kind = part.get("type") if isinstance(part, dict) else getattr(part, "type", None)
    return (
        _PART_TAGS.get(kind, "RefusedContentPart")
        if isinstance(kind, str)
        else "RefusedContentPart"
    )


ContentPart = Annotated[
    Annotated[TextContentPart, Tag("TextContentPart")]
    | Annotated[ImageURLContentPart, Tag("ImageURLContentPart")]
    | Annotated[InputImageContentPart, Tag("InputImageContentPart")]
    | Annotated[RefusedContentPart, Tag("RefusedContentPart")],
    Discriminator(_part_tag),
]


def _content_tag(content: Any) -> str | None:
    if isinstance(content, str):
        return "Text"
    if isinstance(content, list):
        return "Parts"
    return "Null" if content is None else None


# A message's content, checked as the one shape its JSON type says: an error names the part
# at fault only, without "should be a string" from the union's other members.
MessageContent = Annotated[
    Annotated[str, Tag("Text")]
    | Annotated[list[ContentPart], Tag("Parts")]
    | Annotated[None, Tag("Null")],
    Discriminator(
        _content_tag,
        custom_error_type="content_type",
        custom_error_message="content must be a string, a list of content parts or null",
    ),
]


class FunctionDefinition(_Request):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function names
    description: str | None = None
    parameters: dict[str, Any] | None = None  # JSON schema of the arguments object
    strict: bool | None = None


class ChatCompletionToolParam(_Request):
    """One entry of ``tools`` (deeper checks of the schema: ``tool_calls``)."""

    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(_Request):
    name: str


class NamedToolChoice(_Request):
    """``tool_choice`` naming the function the model must call."""

    type: Literal["function"] = "function"
    function: NamedFunction


class FunctionCallParam(_Request):
    name: str
    arguments: str | dict[str, Any]  # JSON text (OpenAI); an object is taken too


class ToolCallParam(_Request):
    """A call in an assistant message of the conversation sent back."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCallParam


class ChatMessageParam(_Request):
    """One message of a chat request: text, and images for a model that takes them. Other
    content part types (audio, image_embeds) are rejected with an error naming the part.

    Any role is taken, as vLLM takes it: chat templates know roles OpenAI does not
    ("ipython", "observation", "function_response"...), and the template decides what
    each means. Only the roles core reads have rules of their own (assistant, tool)."""

    role: str = Field(min_length=1)
    content: MessageContent = None
    name: str | None = None
    tool_call_id: str | None = None  # a tool message: the call it answers
    tool_calls: list[ToolCallParam] | None = None  # an assistant message: the calls it made

    @model_validator(mode="after")
    def _fields_of_the_role(self) -> ChatMessageParam:
        if self.content is None and self.role != "assistant":
            raise ValueError(f"content is required for a {self.role} message")
        if self.role == "tool" and self.tool_call_id is None:
            raise ValueError("tool_call_id is required for a tool message")
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError(f"tool_calls are only allowed in assistant messages, not {self.role}")
        return self

    def to_template(self) -> dict[str, Any]:
        """The message as OpenAI's dict, for core.entrypoints.chat_content to turn into what
        the chat template sees: its content parts as dicts (a missing content is ""), and
        ``developer`` spoken as ``system`` (chat templates know no other)."""
        if isinstance(self.content, list):
            content: str | list[dict[str, Any]] = [
                part.model_dump(exclude_none=True) for part in self.content
            ]
        else:
            content = self.content or ""
        message: dict[str, Any] = {
            "role": "system" if self.role == "developer" else self.role,
            "content": content,
        }
        if self.name is not None:
            message["name"] = self.name
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.tool_calls is not None:
            message["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        return message


# --- requests ------------------------------------------------------------------------------


MAX_N = 128
"""The most choices one request may ask for (OpenAI's limit)."""


class _SamplingRequest(_Request):
    """The sampling fields completions and chat share (OpenAI's and vLLM's extras)."""

    model: str | None = None
    n: int | None = Field(default=None, le=MAX_N)  # OpenAI's limit
    stream: bool | None = False  # OpenAI accepts null for its optional flags: false
    stream_options: StreamOptions | None = None
    echo: bool | None = False
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    seed: int | None = None
    user: str | None = None
    safety_identifier: str | None = None  # OpenAI's successor of `user`
    response_format: ResponseFormat | None = None
    # vLLM extras
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool | None = None
    min_tokens: int | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None
    stop_token_ids: list[TokenId] | None = None
    allowed_token_ids: list[TokenId] | None = None
    bad_words: list[str] | None = None
    structured_outputs: StructuredOutputsRequest | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    # vLLM's scheduling extras (see request_options)
    # lower runs first, with --scheduling-policy priority; the engine core holds an int64
    priority: int = Field(default=0, ge=-(2**63), le=2**63 - 1)
    cache_salt: str | None = Field(default=None, min_length=1)  # prefix-cache isolation key
    # vLLM's prefill/decode disaggregation: what the server's KV connector is asked to do
    # (do_remote_decode on a prefill engine; a prefill's answer on a decode engine).
    kv_transfer_params: dict[str, Any] | None = None
    # vLLM's: logprobs of each prompt token with its top k (-1: the whole vocabulary)
    prompt_logprobs: int | None = Field(default=None, ge=-1)
    # vLLM's: arguments of custom extensions (logits processors), as SamplingParams.extra_args
    vllm_xargs: dict[str, str | int | float | list[str | int | float]] | None = None
    # vLLM's beam search: the n best of n beams, ranked with the length penalty
    # (core.entrypoints.openai.beam_search maps the request)
    use_beam_search: bool = False
    length_penalty: float = 1.0

    @field_validator("stream_options")
    @classmethod
    def _stream_options_need_stream(
        cls, options: StreamOptions | None, info: ValidationInfo
    ) -> StreamOptions | None:
        if options is not None and not info.data.get("stream"):
            raise ValueError("stream_options is only allowed when stream is true")
        return options

    @field_validator("prompt_logprobs")
    @classmethod
    def _prompt_logprobs_not_streamed(cls, k: int | None, info: ValidationInfo) -> int | None:
        # As vLLM: a stream has no place for them (a response carries them whole).
        if k is not None and info.data.get("stream"):
            raise ValueError("prompt_logprobs are not available when stream is true")
        return k


class CompletionRequest(_SamplingRequest):
    """POST /v1/completions. ``prompt`` is one text, a batch of texts, one token-id list
    or a batch of token-id lists; each prompt of a batch gets its own ``n`` choices."""

    unsupported_fields = COMPLETION_UNSUPPORTED
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16  # explicit null: up to the context length
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    suffix: str | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_shape(cls, prompt: Any) -> Any:
        # One clear message instead of pydantic's error per member of the union.
        if not _is_prompt(prompt):
            raise ValueError(
                "prompt must be a string, a list of strings, a list of token ids or a list "
                "of token-id lists, and a list must not be empty"
            )
        return prompt

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, suffix: str | None) -> str | None:
        if suffix is not None:
            raise ValueError("suffix is not supported")
        return suffix

    def prompts(self) -> list[str | list[int]]:
        """The prompts of the batch, each a text or a token-id list."""
        if isinstance(self.prompt, str) or isinstance(self.prompt[0], int):
            return [self.prompt]  # type: ignore[list-item]  # validated: one prompt
        return list(self.prompt)  # type: ignore[arg-type]  # validated: a batch


def _is_prompt(prompt: Any) -> bool:
    def is_ids(value: Any) -> bool:
        return isinstance(value, list) and all(type(i) is int for i in value)

    if isinstance(prompt, str):
        return True
    if not isinstance(prompt, list) or not prompt:
        return False
    return (
        is_ids(prompt)
        or all(isinstance(p, str) for p in prompt)
        or all(is_ids(p) and len(p) > 0 for p in prompt)
    )


class _ChatTemplateRequest(_Request):
    """Fields that turn ``messages`` into a prompt with the chat template."""

    messages: list[ChatMessageParam] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("continue_final_message")
    @classmethod
    def _continue_rules(cls, continue_final: bool, info: ValidationInfo) -> bool:
        if not continue_final:
            return continue_final
        if info.data.get("add_generation_prompt"):
            raise ValueError("continue_final_message and add_generation_prompt cannot both be true")
        messages = info.data.get("messages")
        if messages and messages[-1].role != "assistant":
            raise ValueError("continue_final_message needs the last message to be the assistant's")
        return continue_final

    def conversation(self) -> list[dict[str, Any]]:
        """The messages as plain dicts (ChatMessageParam.to_template)."""
        return [message.to_template() for message in self.messages or ()]


class ChatCompletionRequest(_ChatTemplateRequest, _SamplingRequest):
    """POST /v1/chat/completions. ``max_completion_tokens`` wins over the deprecated
    ``max_tokens``; unset, generation may run up to the context length."""

    unsupported_fields = CHAT_UNSUPPORTED
    messages: list[ChatMessageParam] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    # tool calling (see tool_calls): None means "auto" with tools, else "none"
    tools: list[ChatCompletionToolParam] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = True

    @field_validator("echo")
    @classmethod
    def _no_chat_echo(cls, echo: bool | None) -> bool | None:
        if echo:
            raise ValueError("echo is not supported: chat does not echo the last message")
        return echo

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs_need_logprobs(cls, top: int | None, info: ValidationInfo) -> int | None:
        if top and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs to be true")
        return top


class TokenizeRequest(_ChatTemplateRequest):
    """POST /tokenize: exactly one of ``prompt`` and ``messages``. Special tokens are
    added to a prompt by default, not to messages (the chat template writes them)."""

    model: str | None = None
    prompt: str | None = None
    add_special_tokens: bool | None = None
    return_token_strs: bool = False  # vLLM's: each token's string beside its id

    @model_validator(mode="after")
    def _prompt_or_messages(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("exactly one of prompt and messages must be set")
        if self.add_special_tokens is None:
            self.add_special_tokens = self.prompt is not None
        return self


class DetokenizeRequest(_Request):
    model: str | None = None
    tokens: list[TokenId]


class LoadLoRAAdapterRequest(_Request):
    """POST /v1/load_lora_adapter (vLLM's body): serve the PEFT adapter at `lora_path`
    under the model id `lora_name`."""

    lora_name: str
    lora_path: str


class UnloadLoRAAdapterRequest(_Request):
    """POST /v1/unload_lora_adapter (vLLM's body): stop serving `lora_name`."""

    lora_name: str


# --- responses -----------------------------------------------------------------------------


class PromptTokensDetails(_Response):
    cached_tokens: int = 0


class UsageInfo(_Response):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None  # --enable-prompt-tokens-details


class CompletionLogProbs(_Response):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class PromptLogprob(_Response):
    """vLLM's Logprob: one token's entry at a prompt position."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# vLLM's prompt_logprobs: per prompt position {token id: entry}, None for the first token.
PromptLogprobs = list[dict[int, PromptLogprob] | None]


class CompletionResponseChoice(_Response):
    """A choice of a completion, whole or (streamed) the text added since the last chunk."""

    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: PromptLogprobs | None = None  # a whole choice's, when computed


class CompletionResponse(_Response):
    id: str = _new_id("cmpl")
    object: Literal["text_completion"] = "text_completion"
    created: int = _now()
    model: str
    choices: list[CompletionResponseChoice]
    usage: UsageInfo
    kv_transfer_params: dict[str, Any] | None = None  # the KV connector's, when it has any


class CompletionStreamResponse(_Response):
    id: str = _new_id("cmpl")
    object: Literal["text_completion"] = "text_completion"
    created: int = _now()
    model: str
    choices: list[CompletionResponseChoice]
    usage: UsageInfo | None = None


class ChatCompletionLogProb(_Response):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatCompletionLogProbsContent(ChatCompletionLogProb):
    top_logprobs: list[ChatCompletionLogProb] = Field(default_factory=list)


class ChatCompletionLogProbs(_Response):
    content: list[ChatCompletionLogProbsContent] | None = None


class FunctionCall(_Response):
    name: str
    arguments: str  # JSON text


class ToolCall(_Response):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class DeltaFunctionCall(_Response):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(_Response):
    """A piece of call `index` in a stream: the first carries id, type and name."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall | None = None


class ChatMessage(_Response):
    role: str = "assistant"
    content: str | None = None
    tool_calls: list[ToolCall] | None = None
    reasoning_content: str | None = None  # --reasoning-parser: the thinking, apart from content


class DeltaMessage(_Response):
    role: str | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None
    reasoning_content: str | None = None


class ChatCompletionResponseChoice(_Response):
    index: int
    message: ChatMessage
    logprobs: ChatCompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionStreamChoice(_Response):
    index: int
    delta: DeltaMessage
    logprobs: ChatCompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(_Response):
    id: str = _new_id("chatcmpl")
    object: Literal["chat.completion"] = "chat.completion"
    created: int = _now()
    model: str
    choices: list[ChatCompletionResponseChoice]
    usage: UsageInfo
    kv_transfer_params: dict[str, Any] | None = None  # the KV connector's, when it has any
    prompt_logprobs: PromptLogprobs | None = None  # when the request asked for them


class ChatCompletionStreamResponse(_Response):
    id: str = _new_id("chatcmpl")
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = _now()
    model: str
    choices: list[ChatCompletionStreamChoice]
    usage: UsageInfo | None = None


class ModelCard(_Response):
    """One entry of /v1/models. As in vLLM, `root` is where the model comes from (the
    base model's argument, an adapter's path) and `parent` the model a LoRA adapter runs
    on (None for the base model)."""

    id: str
    object: Literal["model"] = "model"
    created: int = _now()
    owned_by: str = "core"
    root: str | None = None
    parent: str | None = None
    max_model_len: int


class ModelList(_Response):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeResponse(_Response):
    tokens: list[int]
    count: int
    max_model_len: int
    token_strs: list[str] | None = None


class DetokenizeResponse(_Response):
    prompt: str


class ErrorInfo(_Response):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(_Response):
    error: ErrorInfo


# --- builders ------------------------------------------------------------------------------
