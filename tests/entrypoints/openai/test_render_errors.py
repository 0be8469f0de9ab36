"""A chat render error carries the field at fault as data (ChatRenderError.field), and the
server's 400 names that field as its `param`, whatever the message says."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from tiny_engine_checkpoint import engine_args, write_tiny_checkpoint

from core.config import UsageContext
from core.engine.processor import ChatRenderError, EngineSetup, InputProcessor
from core.entrypoints.chat_content import parse_chat_content
from core.entrypoints.openai import protocol as p
from core.entrypoints.openai.errors import OpenAIError
from core.entrypoints.openai.serving import Serving

USER = [{"role": "user", "content": "w1 w2"}]
# Starts with neither field's name: the param cannot come from the message.
MESSAGE = "the template refused this conversation"


def refusal(processor, monkeypatch, error: ChatRenderError, **request) -> OpenAIError:
    """What Serving.render_chat answers when the processor's render_chat raises `error`."""

    def refuse(messages, **_) -> list[int]:
        raise error

    monkeypatch.setattr(processor, "render_chat", refuse)
    engine = SimpleNamespace(processor=processor, reasoning_parser=None)
    serving = Serving(engine, models=None, offload=None, trust_request_chat_template=True)
    req = p.ChatCompletionRequest(messages=USER, **request)
    with pytest.raises(OpenAIError) as raised:
        serving.render_chat(req, parse_chat_content(req.conversation(), None, {}))
    return raised.value


@pytest.mark.parametrize("field", ["chat_template_kwargs", "messages"])
def test_the_param_is_the_field_the_error_carries(processor, monkeypatch, field):
    error = refusal(processor, monkeypatch, ChatRenderError(MESSAGE, field))
    assert (error.status, error.param, error.message) == (400, field, MESSAGE)


def test_a_failed_render_with_the_requests_own_template_names_that_template(processor, monkeypatch):
    own = {"chat_template": "{{ messages }}"}
    refused = refusal(processor, monkeypatch, ChatRenderError(MESSAGE, "messages"), **own)
    assert refused.param == "chat_template"
    kwargs = refusal(
        processor, monkeypatch, ChatRenderError(MESSAGE, "chat_template_kwargs"), **own
    )
    assert kwargs.param == "chat_template_kwargs"


@pytest.fixture(scope="module")
def processor(tmp_path_factory) -> InputProcessor:
    model_dir = write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))
    return InputProcessor(
        EngineSetup.from_engine_args(engine_args(model_dir), UsageContext.SERVING)
    )


def test_the_processor_raises_render_errors_carrying_their_field(processor):
    with pytest.raises(ChatRenderError) as refused:
        processor.render_chat(USER, chat_template_kwargs={"self": 1})
    assert refused.value.field == "chat_template_kwargs"
    assert str(refused.value).startswith("chat_template_kwargs cannot set self: ")
    with pytest.raises(ChatRenderError) as failed:
        processor.render_chat(USER, chat_template="{% for m in messages %}")
    assert failed.value.field == "messages"
    assert str(failed.value).startswith("messages cannot be rendered with the chat template: ")
