"""core.chat_template on its own: template sources from files or strings, and which value a
template variable takes when special tokens, kwargs and the call's own arguments share a name.
Rendering against transformers is pinned through Tokenizer in test_tokenizer.py."""

from __future__ import annotations

import pytest
from gguf_vocab_fixtures import CHAT_TEMPLATE

from core.chat_template import load_chat_template, render_chat_template


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
