"""Tool calling on /v1/chat/completions: `tools`, `tool_choice` and `parallel_tool_calls`.

Every request with tools gets a ToolPlan (`ToolCalling.plan`), after its tools are checked
(400 naming the field: a duplicate name, parameters that are not an object schema or that
the structured-output backend cannot compile). The tools are shown to the chat template.
What happens to the output depends on `tool_choice` (default: "auto" with tools, else
"none"), as with vLLM:

- "none": the output is text.
- "auto": the server's `--tool-call-parser` reads calls out of the output; only when the
  server runs with `--enable-auto-tool-choice` (400 otherwise, as vLLM).
- "required" / a named function: the output is constrained through the structured-output
  backend by a JSON schema built from the tools' parameters, so the calls always parse and
  their arguments validate: an array of `{"name", "parameters"}` objects (one at most
  unless `parallel_tool_calls`) for "required", the function's arguments object for a
  named one. A request cannot also ask for another structured output.

A message with calls finishes with "tool_calls" when generation stopped by itself, except
for a named function, where OpenAI says "stop".
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from core.entrypoints.openai import protocol as p
from core.entrypoints.openai.errors import OpenAIError
from core.outputs import CompletionOutput
from core.sampling_params import SamplingParams, StructuredOutputsParams
from core.tool_parsers import (
    FunctionTool,
    IncrementalToolParser,
    ParsedCall,
    ParsedOutput,
    StreamedDelta,
    ToolParser,
    ToolRequest,
    tool_parser_class,
)
from core.tool_parsers.json_calls import scan_call_array, skip_whitespace

if TYPE_CHECKING:
    from core.tokenizer import Tokenizer

__all__ = ["ToolCalling", "ToolPlan", "ToolStream"]

Choice = Literal["none", "auto", "required", "named"]

# The arguments schema of a function that declares no parameters: an object, any keys.
_ANY_OBJECT: dict[str, Any] = {"type": "object"}


@dataclass(frozen=True)
class ToolCalling:
    """The server's tool-calling settings (`--enable-auto-tool-choice`,
    `--tool-call-parser`), and the planning of each request under them."""

    parser_class: type[ToolParser] | None = None
    enable_auto_tool_choice: bool = False

    @classmethod
    def from_flags(cls, enable_auto_tool_choice: bool, tool_call_parser: str | None) -> ToolCalling:
        """The settings of the two flags; ValueError naming the flag when the parser is not
        installed, or auto tool choice is asked for without a parser."""
        if enable_auto_tool_choice and tool_call_parser is None:
            raise ValueError("--enable-auto-tool-choice needs --tool-call-parser NAME")
        parser = None if tool_call_parser is None else tool_parser_class(tool_call_parser)
        return cls(parser, enable_auto_tool_choice)

    def plan(self, req: p.ChatCompletionRequest, tokenizer: Tokenizer) -> ToolPlan:
        """What `req` does with its tools (parsers are built with `tokenizer`); OpenAIError
        (400) naming the offending field."""
        tools = _function_tools(req.tools or [])
        choice, named = _choice(req, tools)
        request = ToolRequest(tools, parallel_tool_calls=req.parallel_tool_calls is not False)
        template_tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
        if choice == "auto":
            if self.parser_class is None or not self.enable_auto_tool_choice:
                raise _bad_request(
                    'tool_choice "auto" needs the server started with --enable-auto-tool-choice '
                    "and --tool-call-parser",
                    "tool_choice",
                )
            keeps = self.parser_class.keeps_special_tokens
            parser = functools.partial(self.parser_class, tokenizer)
            return ToolPlan(template_tools, request, choice, parser, None, keeps)
        if choice == "required":
            schema = _required_schema(tools, request.parallel_tool_calls)
            return ToolPlan(template_tools, request, choice, _RequiredChoiceParser, schema)
        if choice == "named":
            tool = next(t for t in tools if t.name == named)
            parser = _named_parser(tool.name)
            return ToolPlan(template_tools, request, choice, parser, tool.parameters or _ANY_OBJECT)
        return ToolPlan(template_tools, request, choice)


@dataclass(frozen=True)
class ToolPlan:
    """One request's tool handling: `tools` for the chat template (OpenAI's dicts; None
    without tools), the parser of its output (None: the output is plain text), the JSON
    schema that constrains the output (required / named choices), and whether the
    detokenizer must keep special tokens for the parser (its `keeps_special_tokens`)."""

    tools: list[dict[str, Any]] | None
    request: ToolRequest
    choice: Choice
    new_parser: Callable[[], ToolParser] | None = None
    schema: dict[str, Any] | None = None
    keeps_special_tokens: bool = False

    def sampling_params(self, params: SamplingParams) -> SamplingParams:
        """`params` with what the plan needs: the schema as the structured output (400
        naming tool_choice if the request asks for another one too), special tokens kept
        when the parser's markup is made of them."""
        if self.schema is not None:
            if params.structured_outputs is not None:
                raise _bad_request(
                    f'tool_choice "{self.choice}" constrains the output already; it cannot be '
                    "combined with response_format or another structured output",
                    "tool_choice",
                )
            constraint = StructuredOutputsParams(json=self.schema)
            return msgspec.structs.replace(params, structured_outputs=constraint)
        if self.keeps_special_tokens:
            return msgspec.structs.replace(params, skip_special_tokens=False)
        return params

    def message(self, output: CompletionOutput) -> tuple[p.ChatMessage, str | None]:
        """The assistant's message of a finished sample, and its finish reason."""
        if self.new_parser is None:
            return p.ChatMessage(content=output.text), output.finish_reason
        extracted = self.new_parser().extract_tool_calls(output.text, self.request)
        found = extracted.tool_calls
        content = extracted.content
        if output.finish_reason == "length" and self.schema is not None:
            # Cut off inside the constrained calls: a call whose arguments are not whole
            # JSON is no call (as vLLM answers); the text is kept as content.
            found = [c for c in found if _is_json(c.arguments)]
            if not found:
                content = output.text
        calls = [
            p.ToolCall(id=c.id, function=p.FunctionCall(name=c.name, arguments=c.arguments))
            for c in found
        ]
        message = p.ChatMessage(content=content, tool_calls=calls or None)
        return message, self.finish_reason(bool(calls), output.finish_reason)

    def stream(self) -> ToolStream | None:
        """The state of one streamed sample; None when its output is plain text."""
        return None if self.new_parser is None else ToolStream(self, self.new_parser())

    def finish_reason(self, called: bool, reason: str | None) -> str | None:
        if called and reason == "stop" and self.choice != "named":
            return "tool_calls"
        return reason


class ToolStream:
    """One streamed sample read through the plan's parser: each delta of the engine's
    output becomes content and tool-call pieces."""

    def __init__(self, plan: ToolPlan, parser: ToolParser) -> None:
        self._plan = plan
        self._parser = parser
        self._text = ""
        self._called = False

    def step(self, output: CompletionOutput) -> tuple[p.DeltaMessage, str | None]:
        """The delta to send for `output` (a sample's newest piece; maybe empty) and the
        finish reason (set on the sample's last piece)."""
        self._text += output.text
        finished = output.finish_reason is not None
        delta = self._parser.extract_tool_calls_streaming(
            self._text, output.text, self._plan.request, finished
        )
        message = _delta_message(delta)
        self._called |= bool(message.tool_calls)
        reason = self._plan.finish_reason(self._called, output.finish_reason)
        return message, reason if finished else None


def _delta_message(delta: StreamedDelta | None) -> p.DeltaMessage:
    if delta is None:
        return p.DeltaMessage()
    calls = [
        p.DeltaToolCall(
            index=call.index,
            id=call.id,
            type=None if call.id is None else "function",
            function=p.DeltaFunctionCall(name=call.name, arguments=call.arguments),
        )
        for call in delta.tool_calls
    ]
    return p.DeltaMessage(content=delta.content, tool_calls=calls or None)


# --- checking the request ------------------------------------------------------------------


def _function_tools(tools: list[p.ChatCompletionToolParam]) -> tuple[FunctionTool, ...]:
    """The request's functions, each name unique and each parameters schema usable."""
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        name = tool.function.name
        if name in seen:
            raise _bad_request(
                f"tools[{i}].function.name: {name!r} is offered twice", f"tools[{i}].function.name"
            )
        seen.add(name)
        _check_parameters(tool.function.parameters, f"tools[{i}].function.parameters")
    return tuple(
        FunctionTool(t.function.name, t.function.parameters, t.function.description) for t in tools
    )


def _check_parameters(schema: dict[str, Any] | None, field: str) -> None:
    """A 400 naming `field` unless `schema` describes an object the structured-output
    backend can compile (so "required" and named choices can always constrain by it)."""
    if schema is None:
        return
    if schema.get("type", "object") != "object":
        raise _bad_request(
            f"{field}: must be a JSON schema of an object (type 'object'), got type "
            f"{schema['type']!r}",
            field,
        )
    from core.structured_output.xgrammar_backend import build_grammar  # imports xgrammar

    try:
        build_grammar(StructuredOutputsParams(json=schema))
    except ValueError as exc:
        reason = str(exc).removeprefix("invalid structured_outputs.json: ")
        raise _bad_request(f"{field}: not a usable JSON schema: {reason}", field) from exc


def _choice(
    req: p.ChatCompletionRequest, tools: tuple[FunctionTool, ...]
) -> tuple[Choice, str | None]:
    """The request's choice (the default: "auto" with tools, else "none") and, for a named
    one, the function's name; 400 naming tool_choice when it cannot be honoured."""
    choice = req.tool_choice
    if choice is None:
        return ("auto" if tools else "none"), None
    if choice == "none":
        return "none", None
    if not tools:
        raise _bad_request("tool_choice: needs tools (none were given)", "tool_choice")
    if isinstance(choice, str):
        return choice, None
    name = choice.function.name
    if name not in {t.name for t in tools}:
        raise _bad_request(
            f"tool_choice: names function {name!r}, which is not among the tools", "tool_choice"
        )
    return "named", name


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _bad_request(message: str, param: str) -> OpenAIError:
    return OpenAIError(HTTPStatus.BAD_REQUEST, message, param=param)


# --- constrained choices -------------------------------------------------------------------


def _required_schema(tools: tuple[FunctionTool, ...], parallel: bool) -> dict[str, Any]:
    """One or more calls (one at most unless `parallel`), each naming an offered function
    and giving arguments its parameters schema validates. "name" comes first, so a stream
    can send it before the arguments."""
    definitions: dict[str, Any] = {}
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": [tool.name]},
                "parameters": _embedded(tool.parameters or _ANY_OBJECT, f"tool{i}", definitions),
            },
            "required": ["name", "parameters"],
        }
        for i, tool in enumerate(tools)
    ]
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    if not parallel:
        schema["maxItems"] = 1
    if definitions:
        schema["$defs"] = definitions
    return schema


def _embedded(parameters: dict[str, Any], key: str, definitions: dict[str, Any]) -> Any:
    """`parameters` as a part of a larger schema. One with local references ("$ref": "#/...",
    pydantic's `$defs`) moves to `definitions[key]`, its own definitions beside it as
    `key.NAME`, each reference rewritten to point there: a reference resolves from the root
    of the whole schema, where the tool's definitions would otherwise not be."""
    if not _has_local_ref(parameters):
        return parameters
    own = {**parameters.get("definitions", {}), **parameters.get("$defs", {})}
    root = {k: v for k, v in parameters.items() if k not in ("$defs", "definitions")}
    definitions[key] = _rewrite_refs(root, key)
    for name, definition in own.items():
        definitions[f"{key}.{name}"] = _rewrite_refs(definition, key)
    return {"$ref": f"#/$defs/{key}"}


def _has_local_ref(value: Any) -> bool:
    if isinstance(value, dict):
        ref = value.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            return True
        return any(_has_local_ref(v) for v in value.values())
    return isinstance(value, list) and any(_has_local_ref(v) for v in value)


def _rewrite_refs(value: Any, key: str) -> Any:
    """`value` with each local reference of the tool's schema pointing into `$defs` as
    `_embedded` places it: #/$defs/X and #/definitions/X to #/$defs/KEY.X, any other
    pointer (#, #/properties/...) into #/$defs/KEY."""
    if isinstance(value, list):
        return [_rewrite_refs(v, key) for v in value]
    if not isinstance(value, dict):
        return value
    rewritten = {k: _rewrite_refs(v, key) for k, v in value.items()}
    ref = value.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        pointer = ref[1:]
        for section in ("/$defs/", "/definitions/"):
            if pointer.startswith(section):
                name, _, rest = pointer[len(section) :].partition("/")
                rewritten["$ref"] = f"#/$defs/{key}.{name}" + (f"/{rest}" if rest else "")
                break
        else:
            rewritten["$ref"] = f"#/$defs/{key}{pointer}"
    return rewritten


class _RequiredChoiceParser(IncrementalToolParser):
    """Reads the output `_required_schema` constrains: `[{"name": ..., "parameters": ...}]`."""

    def parse(self, text: str, final: bool) -> ParsedOutput:
        start = skip_whitespace(text, 0)
        if start == len(text) or text[start] != "[":
            return ParsedOutput(content=text if final else "")
        calls, _ = scan_call_array(text, start)
        return ParsedOutput(calls=calls)


def _named_parser(name: str) -> Callable[[], ToolParser]:
    return lambda: _NamedChoiceParser(name)


class _NamedChoiceParser(IncrementalToolParser):
    """Reads an output that is the named function's arguments object, whitespace aside
    (trailing whitespace held back, so each partial result is a prefix of the final)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self._name = name

    def parse(self, text: str, final: bool) -> ParsedOutput:
        return ParsedOutput(calls=[ParsedCall(self._name, text.strip())])
