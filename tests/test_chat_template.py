"""core.chat_template on its own: template sources from files or strings, and which value a
template variable takes when special tokens, kwargs and the call's own arguments share a name.
Rendering against transformers is pinned through Tokenizer in test_tokenizer.py."""

from __future__ import annotations

import sys
import time

import pytest
from gguf_vocab_fixtures import CHAT_TEMPLATE

from core.chat_template import MAX_RENDER_CHARS, load_chat_template, render_chat_template


def test_load_chat_template_reads_files_and_takes_literal_templates(tmp_path):
    path = tmp_path / "template.jinja"
    path.write_text(CHAT_TEMPLATE, encoding="utf-8")
    assert load_chat_template(path) == CHAT_TEMPLATE
    assert load_chat_template(str(path)) == CHAT_TEMPLATE
    assert load_chat_template("{{ messages[0]['content'] }}") == "{{ messages[0]['content'] }}"
    with pytest.raises(ValueError, match="missing.jinja"):
        load_chat_template(str(tmp_path / "missing.jinja"))


def test_kwargs_override_special_tokens_but_not_the_calls_own_arguments():
    template = (
        "{{ bos_token }}|{{ eos_token }}|{{ flavour }}|{{ documents }}|{{ messages | length }}"
        "|{{ tools | length }}|{{ add_generation_prompt }}"
    )
    rendered = render_chat_template(
        template,
        [{"role": "user", "content": "hi"}],
        add_generation_prompt=False,
        tools=[{"type": "function"}],
        special_tokens={"bos_token": "<s>", "eos_token": "</s>"},
        template_kwargs={
            "bos_token": "[BOS]",
            "flavour": "mint",
            "messages": [],
            "tools": [],
            "add_generation_prompt": True,
        },
    )
    assert rendered == "[BOS]|</s>|mint|None|1|1|False"


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
