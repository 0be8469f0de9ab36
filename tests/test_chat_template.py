"""core.chat_template on its own: template sources from files or strings, which value a
template variable takes when special tokens and kwargs share a name, the kwarg names it
refuses, hostile inputs (deep nesting, invalid text) and failing templates as ValueErrors;
which templates loop over a message's content (vLLM's "openai" content format).
Rendering against transformers is pinned through Tokenizer in test_tokenizer.py."""

from __future__ import annotations

import sys
import time

import pytest
from gguf_vocab_fixtures import CHAT_TEMPLATE

from core.chat_template import (
    MAX_RENDER_CHARS,
    load_chat_template,
    loops_over_message_content,
    render_chat_template,
)


def test_load_chat_template_reads_files_and_takes_literal_templates(tmp_path):
    path = tmp_path / "template.jinja"
    path.write_text(CHAT_TEMPLATE, encoding="utf-8")
    assert load_chat_template(path) == CHAT_TEMPLATE
    assert load_chat_template(str(path)) == CHAT_TEMPLATE
    assert load_chat_template("{{ messages[0]['content'] }}") == "{{ messages[0]['content'] }}"
    with pytest.raises(ValueError, match="missing.jinja"):
        load_chat_template(str(tmp_path / "missing.jinja"))


def render_over(template: str, messages=(), tools=None, /, **template_kwargs) -> str:
    # Positional-only, so a kwarg may be named `messages` or `tools` as a client's may.
    return render_chat_template(
        template,
        list(messages),
        add_generation_prompt=False,
        tools=tools,
        special_tokens={"bos_token": "<s>", "eos_token": "</s>"},
        template_kwargs=template_kwargs,
    )


def test_kwargs_override_special_tokens_and_documents():
    template = "{{ bos_token }}|{{ eos_token }}|{{ flavour }}|{{ documents }}"
    assert render_over(template, bos_token="[BOS]", flavour="mint") == "[BOS]|</s>|mint|None"
    assert render_over(template, documents=["d"]) == "<s>|</s>||['d']"


@pytest.mark.parametrize(
    "name",
    [
        "messages",
        "tools",
        "add_generation_prompt",
        "chat_template",
        "continue_final_message",
        "self",
    ],
)
def test_a_kwarg_named_as_an_argument_of_the_render_path_is_refused(name):
    with pytest.raises(ValueError, match=f"^chat_template_kwargs cannot set {name}: "):
        render_over("{{ messages | length }}", [{"role": "user", "content": "hi"}], **{name: []})


def test_template_kwargs_must_be_json_data():
    with pytest.raises(ValueError, match=r"template_kwargs\.when is a object"):
        render_chat_template(
            "{{ when }}",
            [],
            add_generation_prompt=True,
            tools=None,
            special_tokens={},
            template_kwargs={"when": object()},
        )


def test_tool_call_arguments_reach_templates_as_json_objects(caplog):
    def call(arguments):
        return {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}

    template = (
        "{% for m in messages %}{% for c in m.tool_calls %}"
        "{{ c.function.arguments | tojson }};{% endfor %}{% endfor %}"
    )
    texts = ['{"a": 1}', "not json", "[1]", {"b": 2}]
    messages = [{"role": "assistant", "tool_calls": [call(text) for text in texts]}]
    rendered = render_chat_template(
        template,
        messages,
        add_generation_prompt=False,
        tools=None,
        special_tokens={},
        template_kwargs={},
    )
    # Text that is not a JSON object renders as {} (with a warning), never an error.
    assert rendered == '{"a": 1};{};{};{"b": 2};'
    assert [r.getMessage() for r in caplog.records] == [
        "messages[0].tool_calls[1].function.arguments is not a JSON object; rendered as {}",
        "messages[0].tool_calls[2].function.arguments is not a JSON object; rendered as {}",
    ]
    assert messages[0]["tool_calls"][0]["function"]["arguments"] == '{"a": 1}'  # not mutated


def render(template: str, **kwargs) -> str:
    return render_chat_template(
        template,
        [{"role": "user", "content": "hi"}],
        add_generation_prompt=True,
        tools=None,
        special_tokens={},
        template_kwargs={},
        **kwargs,
    )


def test_a_template_that_loops_without_output_stops_at_its_deadline():
    loops = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    started = time.monotonic()
    with pytest.raises(ValueError, match="did not render within 0.2 s"):
        render(loops, max_seconds=0.2)
    # 10^10 iterations would take hours; the deadline stops it (generous margin for CI).
    assert time.monotonic() - started < 5


def test_a_multiplied_string_is_refused_before_it_is_built():
    with pytest.raises(ValueError, match="would build"):
        render("{{ 'hello world ' * 10**9 }}")  # 12 GB if it were built
    with pytest.raises(ValueError, match="would build"):
        render("{{ [1] * 10**9 }}")
    assert render("{{ 'ab' * 3 }}{{ [1, 2] + [3] }}") == "ababab[1, 2, 3]"


def test_the_rendered_prompt_is_bounded():
    per_iteration = MAX_RENDER_CHARS // 50_000 + 1  # 50k iterations pass the bound
    template = f"{{% for i in range(50000) %}}{{{{ 'x' * {per_iteration} }}}}{{% endfor %}}"
    with pytest.raises(ValueError, match="rendered prompt passes"):
        render(template)


def test_the_previous_trace_function_is_restored():
    def tracer(frame, event, arg):
        return None

    sys.settrace(tracer)
    try:
        render("{{ messages[0].content }}")
        assert sys.gettrace() is tracer
        with pytest.raises(ValueError):
            render("{% for i in range(100000) %}{% for j in range(100) %}{% endfor %}{% endfor %}",
                   max_seconds=0.05)  # fmt: skip
        assert sys.gettrace() is tracer
    finally:
        sys.settrace(None)


# --- hostile inputs and failing templates --------------------------------------------------

USER = [{"role": "user", "content": "hi"}]
LIMIT = 64  # core.input_checks.MAX_JSON_DEPTH, pinned here


def nested(levels: int) -> list:
    """`levels` lists, one inside the other, built without recursion."""
    value: list = []
    for _ in range(levels - 1):
        value = [value]
    return value


def test_kwargs_nested_to_the_limit_render_and_one_level_more_is_refused():
    # The kwargs' own dict is the first level.
    assert render_over("{{ deep | length }}", USER, None, deep=nested(LIMIT - 1)) == "1"
    with pytest.raises(ValueError, match="^chat_template_kwargs is nested deeper than 64 levels$"):
        render_over("{{ deep }}", USER, None, deep=nested(LIMIT))


@pytest.mark.parametrize("levels", [500, 5000, 100_000])
def test_deep_inputs_are_value_errors_naming_them_not_recursion_errors(levels):
    with pytest.raises(ValueError, match="^chat_template_kwargs is nested deeper"):
        render_over("{{ x }}", USER, None, x=nested(levels))
    with pytest.raises(ValueError, match="^tools is nested deeper"):
        render_over("{{ x }}", USER, [{"type": "function", "function": nested(levels)}])
    deep_message = [{"role": "user", "content": nested(levels)}]
    with pytest.raises(ValueError, match=r"^messages\[0\]\.content is nested deeper"):
        render_over("{{ x }}", deep_message)


def test_invalid_text_in_any_input_is_a_value_error_naming_where():
    lone = "ok \ud800"
    with pytest.raises(ValueError, match=r"^messages\[0\]\.content contains a lone surrogate"):
        render_over("{{ x }}", [{"role": "user", "content": lone}])
    with pytest.raises(ValueError, match=r"^chat_template_kwargs\.x\[1\] contains a lone"):
        render_over("{{ x }}", USER, None, x=["fine", lone])
    with pytest.raises(ValueError, match=r"^tools\[0\] key contains a lone surrogate"):
        render_over("{{ x }}", USER, [{lone: 1}])


def test_tool_call_arguments_too_deep_to_parse_render_as_an_empty_object(caplog):
    deep = "[" * 5000 + "]" * 5000  # past Python's own parser's recursion limit
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": deep}}
    messages = [{"role": "assistant", "tool_calls": [call]}]
    template = "{{ messages[0].tool_calls[0].function.arguments | tojson }}"
    assert render_over(template, messages) == "{}"
    assert "is not a JSON object; rendered as {}" in caplog.records[0].getMessage()


@pytest.mark.parametrize(
    ("template", "error"),
    [
        ("{{ 1 / 0 }}", "ZeroDivisionError"),
        ("{{ '{0}{1}'.format(1) }}", "IndexError"),
        ("{{ [1, 2] | slice(0) | list }}", "ZeroDivisionError"),
        ("{{ 'abc' | truncate(-1) }}", "AssertionError"),
        ("{{ '%c' | format(10 ** 9) }}", "OverflowError"),
        ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "RecursionError"),
    ],
)
def test_whatever_a_template_raises_is_a_value_error_saying_it_failed(template, error):
    with pytest.raises(ValueError, match=f"^chat template failed to render: {error}"):
        render_over(template, USER)


# Hugging Face's llava-1.5 template (abridged) and Qwen2-VL's: both loop over content parts.
LLAVA = (
    "{% for message in messages %}{{ message['role'].upper() + ': ' }}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "{{ '<image>\\n' }}{% endfor %}{% generation %}{% endgeneration %}{% endfor %}"
)
QWEN2_VL = (
    "{% for message in messages %}{% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}<|image_pad|>{% endif %}{% endfor %}{% endif %}"
    "{% endfor %}"
)


@pytest.mark.parametrize(
    ("template", "loops"),
    [
        (LLAVA, True),
        (QWEN2_VL, True),
        # through aliases of the messages, of a message and of its content, and getattr
        ("{% set ms = messages[1:] %}{% for m in ms %}{% for p in m.content %}{% endfor %}"
         "{% endfor %}", True),
        ("{% for m in messages %}{% set parts = m['content'] | list %}{% for p in parts %}"
         "{% endfor %}{% endfor %}", True),
        # a string content, a loop over a message's keys, another list: no
        (CHAT_TEMPLATE, False),
        ("{% for m in messages %}{% for k in m %}{{ k }}{% endfor %}{% endfor %}", False),
        ("{% for m in tools %}{% for p in m['content'] %}{% endfor %}{% endfor %}", False),
        ("{% for m in messages %", False),  # does not parse
    ],
)  # fmt: skip
def test_a_template_loops_over_content_when_a_message_s_content_is_iterated(template, loops):
    assert loops_over_message_content(template) is loops
