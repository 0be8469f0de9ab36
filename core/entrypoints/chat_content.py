"""The content of chat messages: OpenAI content parts in, template messages and images out.

A message's content is a string, null, or a list of parts: `text`, `image_url` (its
`image_url` is {"url": ...} or, as vLLM accepts, the URL itself), `input_image` (the
Responses API's part: `image_url` is the URL) and, offline only, `image_pil` (a PIL
image). `image_embeds` is refused by name: core encodes images itself. Parsing checks the
parts and counts the images against --limit-mm-per-prompt before any is loaded, so a
request with too many images, or with images for a model that takes none, fetches nothing.

The chat template sees each message's content in one of vLLM's formats
(--chat-template-content-format):
- "string": the parts' texts joined by newlines, after one line per image holding the
  model's placeholder (`<image>`), less the placeholders the text already holds;
- "openai": the list of parts, each image as {"type": "image"}, a string content as one
  text part: for templates that write the placeholders themselves;
- "auto": "openai" when the template loops over a message's content, else "string".

Every error is a ValueError whose message starts with the field at fault
(`messages[0].content[1]`), which the server makes the 400's `param`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

from core.chat_template import loops_over_message_content
from core.multimodal.processing import DEFAULT_ITEM_LIMIT, MultiModalProcessor

if TYPE_CHECKING:
    from core.engine.processor import InputProcessor

__all__ = [
    "CONTENT_FORMATS",
    "ChatContent",
    "ContentFormat",
    "ImagePart",
    "parse_chat_content",
    "messages_for_template",
    "resolve_content_format",
    "template_messages",
]

ContentFormat = Literal["auto", "string", "openai"]
CONTENT_FORMATS: tuple[str, ...] = get_args(ContentFormat)

# The key of each image part type holding the image: its URL, or (image_pil) the image.
_IMAGE_KEYS = {"image_url": "image_url", "input_image": "image_url", "image_pil": "image_pil"}


@dataclass(frozen=True)
class ImagePart:
    """An image of the conversation, not loaded yet: `source` is its URL, or a PIL image;
    `field` is where the request holds it (`messages[0].content[1].image_url`)."""

    field: str
    source: Any


@dataclass(frozen=True)
class ChatContent:
    """A conversation with its content checked: each message as given, its content None or
    a list of {"type": "text", "text": ...} and {"type": "image"} parts; its images in order."""

    messages: list[dict[str, Any]]
    images: list[ImagePart]


def parse_chat_content(
    messages: Sequence[Mapping[str, Any]],
    mm_processor: MultiModalProcessor | None,
    limits: Mapping[str, int],
) -> ChatContent:
    """The conversation's parts checked and its images listed (see the module docstring).
    ValueError naming the part for a part that is not one of those, an image for a model
    that takes none (`mm_processor` None), or the first image past `limits["image"]`."""
    images: list[ImagePart] = []
    parsed = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ValueError(f"messages[{i}] must be a dict, not {type(message).__name__}")
        content = _parts(message.get("content"), f"messages[{i}].content", images)
        parsed.append({**message, "content": content})
    _check_images(images, mm_processor, limits)
    return ChatContent(parsed, images)


def _parts(content: Any, where: str, images: list[ImagePart]) -> list[dict[str, Any]] | None:
    if content is None:
        return None
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise ValueError(f"{where} must be a string, a list of content parts or null")
    return [_part(part, f"{where}[{j}]", images) for j, part in enumerate(content)]


def _part(part: Any, where: str, images: list[ImagePart]) -> dict[str, Any]:
    kind = part.get("type") if isinstance(part, Mapping) else None
    if kind == "text":
        if not isinstance(part.get("text"), str):
            raise ValueError(f"{where}.text must be a string")
        return {"type": "text", "text": part["text"]}
    if kind in _IMAGE_KEYS:
        key = _IMAGE_KEYS[kind]
        images.append(ImagePart(f"{where}.{key}", _image_source(kind, part.get(key), where)))
        return {"type": "image"}
    if kind == "image_embeds":
        raise ValueError(f"{where}: image_embeds is not supported; send the image (image_url)")
    raise ValueError(
        f"{where}: content part type {kind!r} is not supported (text, image_url, input_image)"
    )


def _image_source(kind: str, value: Any, where: str) -> Any:
    """The URL (or, for image_pil, the image) an image part holds."""
    if kind == "image_pil":
        return value  # MediaConnector.load_image checks it is one
    if kind == "image_url" and isinstance(value, Mapping):
        value = value.get("url")
    if not isinstance(value, str):
        shape = "{'url': URL} or a URL" if kind == "image_url" else "a URL"
        raise ValueError(f"{where}.image_url must be {shape}")
    return value


def _check_images(
    images: list[ImagePart], mm_processor: MultiModalProcessor | None, limits: Mapping[str, int]
) -> None:
    if not images:
        return
    if mm_processor is None or "image" not in mm_processor.modalities:
        raise ValueError(f"{images[0].field}: this model takes text only, not images")
    limit = limits.get("image", DEFAULT_ITEM_LIMIT)
    if len(images) > limit:
        raise ValueError(
            f"{images[limit].field}: {len(images)} images, more than the {limit} a prompt may "
            "have (--limit-mm-per-prompt)"
        )


def resolve_content_format(
    content_format: ContentFormat, template: str | None
) -> Literal["string", "openai"]:
    """`content_format`, with "auto" decided by the chat template `template` (see the module
    docstring); "string" when there is no template."""
    if content_format != "auto":
        return content_format
    return "openai" if template and loops_over_message_content(template) else "string"


def messages_for_template(
    processor: InputProcessor,
    content: ChatContent,
    content_format: ContentFormat,
    chat_template: str | None,
    tools: object = None,
) -> list[dict[str, Any]]:
    """The messages `processor.render_chat` takes for `content`, `content_format` resolved
    against the template it renders with for `chat_template` (a request's, or None) and
    `tools`: the one path of the offline API and the server."""
    template = processor.chat_template_source(chat_template, tools)
    resolved = resolve_content_format(content_format, template)
    return template_messages(content, resolved, processor.mm_processor)


def template_messages(
    content: ChatContent,
    content_format: Literal["string", "openai"],
    mm_processor: MultiModalProcessor | None,
) -> list[dict[str, Any]]:
    """The messages as the chat template takes them in `content_format`; `mm_processor`
    gives the image placeholder of the "string" format (needed only with images)."""
    if content_format == "openai":
        return content.messages
    placeholder = mm_processor.placeholder_text("image") if content.images and mm_processor else ""
    return [
        {**message, "content": _string_content(message["content"], placeholder)}
        for message in content.messages
    ]


def _string_content(parts: list[dict[str, Any]] | None, placeholder: str) -> str | None:
    """vLLM's string format: a line per image the text does not already place, then the
    texts, one per line."""
    if parts is None:
        return None
    text = "\n".join(part["text"] for part in parts if part["type"] == "text")
    num_images = sum(part["type"] == "image" for part in parts)
    missing = num_images - text.count(placeholder) if num_images else 0
    return "\n".join([placeholder] * missing + [text]) if missing > 0 else text
