"""Chat templates: loaded from a file or a string, rendered as Hugging Face templates expect.

Chat templates come from model files, so they are untrusted code: they render in jinja2's
immutable sandbox, with the few helpers Hugging Face templates call (raise_exception,
strftime_now, a json.dumps-style tojson, `{% generation %}` blocks), over inputs copied to
plain JSON data.

A render is bounded: its output size, every `*` or `+` whose result would pass that size
(checked before the result is built), and its time, checked at every line of the compiled
template by a trace function on the rendering thread. A template that
loops without output or multiplies a string would otherwise hold a thread (and, in the
server, a request) for as long as it likes.

Tool calls in assistant messages reach templates with their arguments as a JSON object, as
Hugging Face templates expect (`tool_call.arguments | tojson`, `.items()`), though OpenAI
clients send them as JSON text. Arguments that are not a JSON object become {} with a
warning rather than an error: the message is history the client sends back every turn, and
refusing it would make the conversation unrecoverable.

Inputs are checked before anything renders (core.input_checks): text must be valid Unicode
and data nest at most MAX_JSON_DEPTH levels, so a hostile payload is a ValueError naming
its field, never a RecursionError.
"""

from __future__ import annotations

import functools
import json
import logging
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox

from core.input_checks import check_json_data, parse_json_text

__all__ = [
    "MAX_RENDER_CHARS",
    "MAX_RENDER_SECONDS",
    "RESERVED_TEMPLATE_KWARGS",
    "check_template_kwargs",
    "load_chat_template",
    "loops_over_message_content",
    "render_chat_template",
]

logger = logging.getLogger(__name__)

# The rendered prompt's length, and of any string or list a `*` or `+` builds on the way:
# twice the text of a million-token context.
MAX_RENDER_CHARS = 8 * 1024 * 1024
# Wall time of one render: a real template renders a conversation in milliseconds.
MAX_RENDER_SECONDS = 2.0

RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "messages",
        "tools",
        "add_generation_prompt",
        "chat_template",
        "continue_final_message",
        "self",
    }
)
"""Names a template kwarg cannot take: the variables the renderer sets itself and the
keywords of the render path (InputProcessor.render_chat, Tokenizer.apply_chat_template,
whose receiver is `self`). A kwarg under one of them would be shadowed, or collide with the
argument of the same name; it is refused, so a client never wonders which value won."""


def render_chat_template(
    source: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool,
    tools: Sequence[Mapping[str, Any]] | None,
    special_tokens: Mapping[str, str],
    template_kwargs: Mapping[str, Any],
    max_seconds: float = MAX_RENDER_SECONDS,
) -> str:
    """Render the template `source` over `messages` and OpenAI-style `tools`.

    `special_tokens` (bos_token -> "<s>", ...) and `template_kwargs` (e.g. enable_thinking)
    are template variables too; a kwarg overrides a special token and `documents`, and one
    named in RESERVED_TEMPLATE_KWARGS is refused. Every input must be JSON data (dicts,
    lists, str, numbers, bool, None; see the module docstring); message keys set to None
    are dropped. Raises ValueError for a syntax error, bad input, a failed render, or a
    render past MAX_RENDER_CHARS characters or `max_seconds` seconds.
    """
    template = _compile_chat_template(source)
    context = {
        **special_tokens,
        "documents": None,
        **_template_kwargs(template_kwargs),
        "messages": _template_messages(messages),
        "tools": _plain_data(tools, "tools"),
        "add_generation_prompt": add_generation_prompt,
    }
    try:
        with _Deadline(max_seconds):
            return _bounded_join(template.generate(context))
    except Exception as e:
        # The template is untrusted code running in the sandbox: whatever it raises
        # (raise_exception, a SecurityError, a render limit, 1/0, an index out of range,
        # runaway recursion) is its failure to render this input, not the server's.
        raise ValueError(f"chat template failed to render: {type(e).__name__}: {e}") from e


def check_template_kwargs(template_kwargs: Mapping[str, Any]) -> None:
    """ValueError naming chat_template_kwargs when a key is reserved (see
    RESERVED_TEMPLATE_KWARGS) or a value is not JSON data as the module docstring says."""
    _template_kwargs(template_kwargs)


def _template_kwargs(template_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    reserved = sorted(RESERVED_TEMPLATE_KWARGS.intersection(template_kwargs))
    if reserved:
        raise ValueError(
            f"chat_template_kwargs cannot set {', '.join(reserved)}: the chat template "
            "renderer sets these itself (pass them as arguments of their own)"
        )
    return _plain_data(template_kwargs, "chat_template_kwargs")


class RenderLimitError(jinja2.TemplateError):
    """A render went past MAX_RENDER_CHARS or its time."""


def _bounded_join(chunks: Iterator[str]) -> str:
    parts, size = [], 0
    for chunk in chunks:
        size += len(chunk)
        if size > MAX_RENDER_CHARS:
            raise RenderLimitError(f"the rendered prompt passes {MAX_RENDER_CHARS} characters")
        parts.append(chunk)
    return "".join(parts)


class _Deadline:
    """Raises RenderLimitError in the rendering thread's Python frames once `seconds` have
    passed. Template code is compiled Python, so a line event comes with every loop
    iteration; a trace function is the one way to stop a loop that calls nothing. The
    thread's previous trace function (a debugger, coverage) is put back afterwards."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __enter__(self) -> None:
        self.deadline = time.monotonic() + self.seconds
        self.expired = False
        self.previous = sys.gettrace()
        sys.settrace(self._on_call)

    def __exit__(self, *exc: object) -> None:
        sys.settrace(self.previous)

    def _on_call(self, frame: FrameType, event: str, arg: object):
        return self._on_line

    def _on_line(self, frame: FrameType, event: str, arg: object):
        if self.expired:  # raised once; jinja's own error handling must run untraced
            return None
        if time.monotonic() > self.deadline:
            self.expired = True
            raise RenderLimitError(f"the chat template did not render within {self.seconds} s")
        return self._on_line


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant turns for training masks in
    Hugging Face templates; serving needs only the text, so the block renders its body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson HTML-escapes and sorts keys; templates are written for json.dumps.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(date_format: str) -> str:
    return datetime.now().strftime(date_format)


class _BoundedSandbox(jinja2.sandbox.ImmutableSandboxedEnvironment):
    """The immutable sandbox, with `*` and `+` checked before they build a sequence longer
    than MAX_RENDER_CHARS (one `{{ 'x' * 10**9 }}` would otherwise allocate it)."""

    intercepted_binops = frozenset({"*", "+"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        size = _result_size(operator, left, right)
        if size > MAX_RENDER_CHARS:
            raise RenderLimitError(f"an expression would build {size} items")
        return super().call_binop(context, operator, left, right)


def _result_size(operator: str, left: Any, right: Any) -> int:
    """The length of `left <operator> right` when it is a sequence, else 0."""
    if operator == "*":
        for seq, times in ((left, right), (right, left)):
            if isinstance(seq, (str, list, tuple)) and isinstance(times, int):
                return len(seq) * max(times, 0)
        return 0
    if isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
        return len(left) + len(right)
    return 0


@functools.lru_cache(maxsize=1)
def _template_environment() -> jinja2.sandbox.ImmutableSandboxedEnvironment:
    env = _BoundedSandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationBlock, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@functools.lru_cache(maxsize=32)
def _compile_chat_template(source: str) -> jinja2.Template:
    try:
        return _template_environment().from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise ValueError(f"chat template has a syntax error at line {e.lineno}: {e}") from e


def _plain_data(value: Any, where: str) -> Any:
    """A copy made of JSON types only, so a template cannot reach methods of richer objects;
    checked first (core.input_checks), so the copy's recursion stays shallow."""
    check_json_data(value, where)
    return _copy(value, where)


def _copy(value: Any, where: str) -> Any:
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, Mapping):
        return {str(k): _copy(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_copy(v, f"{where}[{i}]") for i, v in enumerate(value)]
    raise ValueError(f"{where} is a {type(value).__name__}; template inputs must be JSON data")


def _template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    # Keys set to None are dropped, as Hugging Face does: templates test `'key' in message`
    # and would otherwise render a literal "None" (e.g. OpenAI's content=None with tool_calls).
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ValueError(f"messages[{i}] is a {type(message).__name__}, not a dict")
    plain = [
        {k: _plain_data(v, f"messages[{i}].{k}") for k, v in m.items() if v is not None}
        for i, m in enumerate(messages)
    ]
    for i, message in enumerate(plain):
        for j, call in enumerate(message.get("tool_calls") or ()):
            _parse_arguments(call, f"messages[{i}].tool_calls[{j}]")
    return plain


def _parse_arguments(call: Any, where: str) -> None:
    """Turn the JSON text of `call`'s function arguments into the object templates expect,
    in place ({} with a warning when it is not a JSON object; see the module docstring)."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
        return
    try:
        arguments = parse_json_text(function["arguments"], f"{where}.function.arguments")
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict):
        logger.warning("%s.function.arguments is not a JSON object; rendered as {}", where)
        arguments = {}
    function["arguments"] = arguments


def load_chat_template(path_or_string: str | Path) -> str:
    """A chat template from a file path, or the string itself when it is a template.

    A template always contains '{', '}' or a newline, so a string without any is a path; a
    path that names no file raises ValueError naming it.
    """
    text = str(path_or_string)
    if any(c in text for c in "{}\n"):
        return text
    path = Path(text)
    if not path.is_file():
        raise ValueError(f"chat template file {text!r} does not exist")
    return path.read_text(encoding="utf-8")


@functools.lru_cache(maxsize=32)
def loops_over_message_content(source: str) -> bool:
    """Whether the template `source` loops over a message's content (`{% for part in
    message['content'] %}`): it takes content as a list of parts (vLLM's "openai" content
    format), not as a string. Names are followed through `{% set %}`, filters, tests and
    slices (`messages[1:]`, `message.content | selectattr(...)`), as vLLM's detection does.
    False for a template that does not parse (rendering it will say why)."""
    try:
        tree = _template_environment().parse(source)
    except jinja2.TemplateSyntaxError:
        return False
    loops = list(tree.find_all(jinja2.nodes.For))
    message_lists = _bound_names(tree, {"messages"}, _names_one_of)
    loop_items = {
        loop.target.name
        for loop in loops
        if isinstance(loop.target, jinja2.nodes.Name) and _names_one_of(loop.iter, message_lists)
    }
    messages = _bound_names(tree, loop_items, _names_one_of)
    contents = _bound_names(tree, set(), lambda node, _: _is_content_of(node, messages))
    contents = _bound_names(tree, contents, _names_one_of)
    return any(
        _is_content_of(loop.iter, messages) or _names_one_of(loop.iter, contents) for loop in loops
    )


def _bound_names(
    tree: jinja2.nodes.Template,
    names: set[str],
    binds: Callable[[jinja2.nodes.Node, set[str]], bool],
) -> set[str]:
    """`names` and every name a `{% set name = value %}` binds where `binds(value, names)`,
    until no more are found (an alias of an alias counts)."""
    assigns = [
        a for a in tree.find_all(jinja2.nodes.Assign) if isinstance(a.target, jinja2.nodes.Name)
    ]
    found = set(names)
    while new := {a.target.name for a in assigns if binds(a.node, found)} - found:
        found |= new
    return found


def _unwrapped(node: jinja2.nodes.Node) -> jinja2.nodes.Node:
    """The value under its filters, tests and slices: `messages[1:] | reverse` -> messages."""
    while True:
        if isinstance(node, jinja2.nodes.Filter | jinja2.nodes.Test) and node.node is not None:
            node = node.node
        elif isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice):
            node = node.node
        else:
            return node


def _names_one_of(node: jinja2.nodes.Node, names: set[str]) -> bool:
    node = _unwrapped(node)
    return isinstance(node, jinja2.nodes.Name) and node.name in names


def _is_content_of(node: jinja2.nodes.Node, names: set[str]) -> bool:
    """`message['content']` or `message.content` (filtered or sliced) of a name in `names`."""
    node = _unwrapped(node)
    if isinstance(node, jinja2.nodes.Getitem):
        key = node.arg
        is_content = isinstance(key, jinja2.nodes.Const) and key.value == "content"
    elif isinstance(node, jinja2.nodes.Getattr):
        is_content = node.attr == "content"
    else:
        return False
    return is_content and _names_one_of(node.node, names)
