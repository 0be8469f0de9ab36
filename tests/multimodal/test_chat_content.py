"""Chat content parts: checked and counted before any image is loaded, then shown to the chat
template as vLLM's "string" or "openai" content format (auto: by the template's AST)."""

from __future__ import annotations

import pytest
from PIL import Image
from stand_in_image_processor import PLACEHOLDER, StandInImageProcessor
from tiny_engine_checkpoint import engine_args, write_tiny_checkpoint

from core.config import UsageContext
from core.engine.processor import EngineSetup, InputProcessor
from core.entrypoints.chat_content import (
    ChatContent,
    ImagePart,
    parse_chat_content,
    resolve_content_format,
    template_messages,
)
from core.testing.tiny_checkpoint import CHAT_TEMPLATE

IMAGES = StandInImageProcessor()
URL = "http://x/a.png"


def image_url(url: str = URL) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def text(words: str) -> dict:
    return {"type": "text", "text": words}


def user(*parts: dict) -> dict:
    return {"role": "user", "content": list(parts)}


def parse(*messages: dict, limit: int | None = None) -> ChatContent:
    return parse_chat_content(messages, IMAGES, {} if limit is None else {"image": limit})


def refused(reason: str, *messages: dict, processor=IMAGES, limit: int | None = None) -> str:
    limits = {} if limit is None else {"image": limit}
    with pytest.raises(ValueError) as error:
        parse_chat_content(messages, processor, limits)
    assert reason in str(error.value), error.value
    return str(error.value)


# --- parsing -------------------------------------------------------------------------------


def test_every_image_part_kind_is_listed_in_order_with_its_field():
    pil = Image.new("RGB", (1, 1))
    content = parse(
        {"role": "system", "content": "be brief"},
        user(text("see"), image_url("http://x/1.png"), {"type": "image_url", "image_url": "u2"}),
        user({"type": "input_image", "image_url": "u3"}, {"type": "image_pil", "image_pil": pil}),
        {"role": "assistant", "content": None},
    )
    assert content.images == [
        ImagePart("messages[1].content[1].image_url", "http://x/1.png"),
        ImagePart("messages[1].content[2].image_url", "u2"),
        ImagePart("messages[2].content[0].image_url", "u3"),
        ImagePart("messages[2].content[1].image_pil", pil),
    ]
    assert [m["content"] for m in content.messages] == [
        [text("be brief")],
        [text("see"), {"type": "image"}, {"type": "image"}],
        [{"type": "image"}, {"type": "image"}],
        None,
    ]


@pytest.mark.parametrize(
    ("part", "message"),
    [
        (
            {"type": "image_embeds", "image_embeds": "AAAA"},
            "messages[0].content[1]: image_embeds is not supported; send the image (image_url)",
        ),
        (
            {"type": "input_audio"},
            "messages[0].content[1]: content part type 'input_audio' is not supported",
        ),
        ({"text": "untyped"}, "messages[0].content[1]: content part type None is not supported"),
        ({"type": "text", "text": 3}, "messages[0].content[1].text must be a string"),
        (
            {"type": "image_url", "image_url": {"uri": URL}},
            "messages[0].content[1].image_url must be {'url': URL} or a URL",
        ),
        ({"type": "input_image"}, "messages[0].content[1].image_url must be a URL"),
    ],
)
def test_a_part_that_is_not_text_or_an_image_is_refused_naming_it(part, message):
    assert refused(message, user(text("see"), part)).startswith(message)


def test_content_of_another_type_and_a_message_that_is_no_dict_are_refused():
    refused("messages[0].content must be a string, a list of content parts or null", {"content": 3})
    refused("messages[1] must be a dict, not str", user(text("hi")), "hello")


def test_a_model_that_takes_text_only_refuses_the_first_image():
    message = refused(
        "messages[0].content[1].image_url: this model takes text only, not images",
        user(text("see"), image_url(), image_url()),
        processor=None,
    )
    assert message.startswith("messages[0].content[1].image_url")
    assert parse_chat_content([user(text("no images"))], None, {}).images == []


def test_images_past_the_limit_are_refused_naming_the_first_one_over_it():
    three = (user(image_url(), text("and")), user(image_url(), image_url()))
    assert len(parse(*three, limit=3).images) == 3
    refused(
        "messages[1].content[1].image_url: 3 images, more than the 2 a prompt may have "
        "(--limit-mm-per-prompt)",
        *three,
        limit=2,
    )
    refused("messages[0].content[0].image_url: 3 images, more than the 0", *three, limit=0)


# --- formats -------------------------------------------------------------------------------


def test_string_format_puts_a_placeholder_line_per_image_before_the_texts():
    content = parse(
        user(text("first"), image_url(), text("second"), image_url()),
        {"role": "assistant", "content": "plain"},
        {"role": "assistant", "content": None},
    )
    assert template_messages(content, "string", IMAGES) == [
        {"role": "user", "content": f"{PLACEHOLDER}\n{PLACEHOLDER}\nfirst\nsecond"},
        {"role": "assistant", "content": "plain"},
        {"role": "assistant", "content": None},
    ]


def test_string_format_counts_the_placeholders_the_text_already_holds():
    content = parse(user(text(f"left {PLACEHOLDER} right"), image_url(), image_url()))
    assert template_messages(content, "string", IMAGES)[0]["content"] == (
        f"{PLACEHOLDER}\nleft {PLACEHOLDER} right"
    )


def test_string_format_of_text_only_messages_needs_no_processor():
    content = parse_chat_content([user(text("a"), text("b"))], None, {})
    assert template_messages(content, "string", None) == [{"role": "user", "content": "a\nb"}]


def test_openai_format_keeps_the_parts_with_images_as_image_parts():
    content = parse({"role": "system", "content": "sys"}, user(image_url(), text("what")))
    assert template_messages(content, "openai", IMAGES) == [
        {"role": "system", "content": [text("sys")]},
        {"role": "user", "content": [{"type": "image"}, text("what")]},
    ]


LOOPING = (
    "{% for message in messages %}{% for part in message['content'] %}"
    "{{ part['type'] }}{% endfor %}{% endfor %}"
)
PLAIN = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


@pytest.mark.parametrize(
    ("requested", "template", "resolved"),
    [
        ("auto", LOOPING, "openai"),
        ("auto", PLAIN, "string"),
        ("auto", None, "string"),
        ("string", LOOPING, "string"),
        ("openai", PLAIN, "openai"),
    ],
)
def test_auto_follows_the_template_and_an_explicit_format_wins(requested, template, resolved):
    assert resolve_content_format(requested, template) == resolved


# --- the template a render uses ------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))


def processor_for(model_dir, **overrides) -> InputProcessor:
    args = engine_args(model_dir, **overrides)
    return InputProcessor(EngineSetup.from_engine_args(args, UsageContext.OFFLINE))


def test_the_template_source_is_the_requests_then_the_configured_then_the_models(model_dir):
    plain = processor_for(model_dir)
    assert plain.chat_template_source(None) == CHAT_TEMPLATE
    assert plain.chat_template_source(LOOPING) == LOOPING
    configured = processor_for(model_dir, chat_template=LOOPING)
    assert configured.chat_template_source(None) == LOOPING
    assert configured.chat_template_source(PLAIN) == PLAIN
