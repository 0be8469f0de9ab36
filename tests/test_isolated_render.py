"""Templates from outside the deployment render in a process of their own: the same text,
the same errors, and allocations past the sandbox's reach fail there, not here."""

from __future__ import annotations

import os
import signal

import pytest
from tiny_engine_checkpoint import write_tiny_checkpoint

import core.tokenizer as tokenizer_module
from core.chat_template import render_chat_template
from core.isolated_render import IsolatedRenderer
from core.tokenizer import Tokenizer

MESSAGES = [{"role": "user", "content": "w1 w2"}, {"role": "assistant", "content": "w3"}]
INPUTS = {"messages": MESSAGES, "add_generation_prompt": True, "tools": None,
          "special_tokens": {"bos_token": "<s>"}, "template_kwargs": {"who": "w9"}}  # fmt: skip
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}|{% endfor %}{{ who }}"
)
# Each builds a string of hundreds of MB with a filter or a method that takes a size.
ALLOCATING = [
    "{{ ('x'|center(300000000))|length }}",
    "{{ messages|tojson(indent=50000000) }}",
    "{{ 'x'.ljust(300000000)|length }}",
    "{{ ('%300000000s' % 'x')|length }}",
    "{{ ('y\\n' * 1000)|indent(300000) }}",
]


def reset_peak_rss() -> None:
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")  # Linux: VmHWM starts again from the current RSS


def peak_rss_bytes() -> int:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


@pytest.fixture(scope="module")
def renderer():
    renderer = IsolatedRenderer()
    yield renderer
    renderer.close()


def test_an_isolated_render_equals_the_in_process_one(renderer):
    assert renderer.render(source=TEMPLATE, **INPUTS) == render_chat_template(TEMPLATE, **INPUTS)


def test_an_isolated_render_fails_with_the_in_process_error(renderer):
    source = "{{ raise_exception('no system prompt') }}"
    with pytest.raises(ValueError) as here:
        render_chat_template(source, **INPUTS)
    with pytest.raises(ValueError) as there:
        renderer.render(source=source, **INPUTS)
    assert str(there.value) == str(here.value)


@pytest.mark.parametrize("source", ALLOCATING)
def test_allocations_fail_in_the_render_process_not_here(renderer, source):
    reset_peak_rss()
    before = peak_rss_bytes()
    with pytest.raises(ValueError, match="chat template failed to render"):
        renderer.render(source=source, **INPUTS)
    assert peak_rss_bytes() - before < 64 * 2**20
    assert renderer.render(source=TEMPLATE, **INPUTS).startswith("<s>user")  # it carries on


def test_a_render_process_that_stops_answering_is_killed_and_started_again(renderer):
    renderer.render(source=TEMPLATE, **INPUTS)
    stopped = renderer._running_child()
    os.kill(stopped.pid, signal.SIGSTOP)
    with pytest.raises(ValueError, match="its process was stopped"):
        renderer.render(source=TEMPLATE, max_seconds=0.1, **INPUTS)
    assert stopped.poll() is not None  # killed
    assert renderer.render(source=TEMPLATE, **INPUTS).startswith("<s>user")


def test_a_render_process_that_died_between_renders_is_started_again(renderer):
    renderer.render(source=TEMPLATE, **INPUTS)
    dead = renderer._running_child()
    dead.kill()
    dead.wait()
    assert renderer.render(source=TEMPLATE, **INPUTS).startswith("<s>user")
    assert renderer._running_child().pid != dead.pid


def test_only_templates_from_outside_render_isolated(tmp_path, monkeypatch):
    """The model's own template and one the deployment trusts render here; a template
    passed as source goes to the isolated renderer."""
    tokenizer = Tokenizer.from_dir(write_tiny_checkpoint(tmp_path))
    sent: list[str] = []

    class Recording:
        def render(self, source, **inputs):
            sent.append(source)
            return render_chat_template(source, **inputs)

    monkeypatch.setattr(tokenizer_module, "isolated_renderer", Recording)
    tokenizer.apply_chat_template(MESSAGES)
    tokenizer.trust_chat_template("{{ 'deployment' }}")
    assert tokenizer.apply_chat_template(MESSAGES, chat_template="{{ 'deployment' }}") == (
        "deployment"
    )
    assert sent == []
    assert tokenizer.apply_chat_template(MESSAGES, chat_template="{{ 'request' }}") == "request"
    assert sent == ["{{ 'request' }}"]
