"""What becomes of each field of a request body: honoured, refused, or ignored with a warning.

An option is honoured or refused, never accepted and ignored. A field that reaches the
server is one of three kinds:

- a field of the request model: validated strictly, then used;
- a field core knows from vLLM's or OpenAI's protocol but does not implement: the model
  declares it in `unsupported_fields`. Sent with a value that asks for nothing (null, false
  or the protocol's default: `Unsupported.off`) it is fine; with any other value the
  request is refused, a 400 naming the field. Once a model declares the field itself
  (someone implemented it), the field is honoured and the entry no longer applies;
- any other field: ignored with a logged warning naming it, as vLLM does (clients send
  fields a server does not know, as they do to OpenAI).

`refuse_unsupported` (before a model validates its data) and `warn_unknown` (once it did)
are the one place this is decided; protocol's `_Request` runs them for every request model,
future ones included.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic_core import InitErrorDetails, PydanticCustomError, ValidationError

__all__ = [
    "CHAT_UNSUPPORTED",
    "COMPLETION_UNSUPPORTED",
    "STREAM_OPTIONS_UNSUPPORTED",
    "Unsupported",
    "refuse_unsupported",
    "warn_unknown",
]

logger = logging.getLogger(__name__)

# The longest shown part of a refused value: a refused `documents` may be megabytes.
_MAX_SHOWN = 60


@dataclass(frozen=True)
class Unsupported:
    """A known field this server does not implement: `reason` says why, or what to send
    instead; `off` holds the values that ask for nothing."""

    reason: str
    off: tuple[Any, ...] = (None,)


def refuse_unsupported(model: type[BaseModel], data: Any) -> None:
    """Raise a pydantic ValidationError at the first of `data`'s fields that `model`
    declares unsupported and that asks for something (so the server's 400 names it). Data
    that is not a JSON object is left to the model's own validation."""
    if not isinstance(data, dict):
        return
    known = _field_names(model)
    for name, field in _unsupported(model).items():
        if name in data and name not in known and not _is_off(data[name], field.off):
            raise _refusal(model, name, data[name], field.reason)


def warn_unknown(model: type[BaseModel], data: Any) -> None:
    """Log the fields of `data` (which `model` took) that `model` does not know."""
    if not isinstance(data, dict):
        return
    unknown = set(data) - _field_names(model) - set(_unsupported(model))
    if unknown:
        shown = ", ".join(repr(name) for name in sorted(unknown))
        logger.warning("The following fields were present in the request but ignored: {%s}", shown)


def _unsupported(model: type[BaseModel]) -> Mapping[str, Unsupported]:
    return getattr(model, "unsupported_fields", {})


def _is_off(value: Any, off: tuple[Any, ...]) -> bool:
    # By type as well as value: `true` is not the 1 that means "one candidate".
    return any(type(value) is type(o) and value == o for o in off)


@functools.cache
def _field_names(model: type[BaseModel]) -> frozenset[str]:
    """The keys `model` reads: its field names and their aliases."""
    names = set(model.model_fields)
    names.update(f.alias for f in model.model_fields.values() if f.alias is not None)
    return frozenset(names)


def _refusal(model: type[BaseModel], name: str, value: Any, reason: str) -> ValidationError:
    shown = repr(value)
    if len(shown) > _MAX_SHOWN:
        shown = shown[:_MAX_SHOWN] + "..."
    # The message goes in the context: a template would read braces in the value as fields.
    message = f"{name} {shown} is not supported: {reason}"
    error = PydanticCustomError("unsupported_field", "{message}", {"message": message})
    details = InitErrorDetails(type=error, loc=(name,), input=value)
    return ValidationError.from_exception_data(model.__name__, [details])


_OFF_FLAG = (None, False)
_OFF_MAP: tuple[Any, ...] = (None, {})

_SAMPLING = {
    # vLLM's sampling and extra fields of both endpoints
    "best_of": Unsupported(
        "best-of sampling is not implemented; ask for n samples and choose among them",
        (None, 1),
    ),
    "watermarking": Unsupported("watermarking is not implemented", _OFF_FLAG),
    "truncate_prompt_tokens": Unsupported("prompts are never truncated; send a shorter prompt"),
    "truncation_side": Unsupported("prompts are never truncated (see truncate_prompt_tokens)"),
    "logprob_token_ids": Unsupported(
        "logprobs of chosen token ids are not implemented; ask for the top logprobs"
    ),
    "logits_processors": Unsupported(
        "per-request logits processors are not supported (nor by vLLM v1); start the server "
        "with --logits-processors or install a core.logits_processors plugin, and pass its "
        "arguments in vllm_xargs"
    ),
    "guided_decoding_backend": Unsupported(
        "structured outputs always use xgrammar", (None, "auto", "xgrammar")
    ),
    "guided_whitespace_pattern": Unsupported("a JSON whitespace pattern is not implemented"),
    "structural_tag": Unsupported("structural tags are not implemented"),
    "return_tokens_as_token_ids": Unsupported("logprob tokens are always their text", _OFF_FLAG),
    "return_token_ids": Unsupported("token ids are not returned with the text", _OFF_FLAG),
    "return_token_offsets": Unsupported("there are no render endpoints", _OFF_FLAG),
    "return_mm_kwargs": Unsupported("there are no render endpoints", (None, True)),
    "routed_experts_prompt_start": Unsupported("routed experts are not returned", (None, 0)),
    "prompt_embeds": Unsupported("prompts are text or token ids, not embeddings"),
    "mm_processor_kwargs": Unsupported(
        "the multimodal processor takes no per-request arguments", _OFF_MAP
    ),
    "thinking_token_budget": Unsupported("a thinking token budget is not implemented", (None, -1)),
    "repetition_detection": Unsupported("repetition detection is not implemented"),
    "stream_interval": Unsupported("a stream sends every token as it comes", (None, 1)),
    "session_id": Unsupported("sessions are not tracked"),
    "ec_transfer_params": Unsupported("encoder-cache transfer is not implemented"),
    "request_id": Unsupported("send the request id as the X-Request-Id header"),
    # OpenAI's fields of both endpoints
    "prompt_cache_key": Unsupported(
        "the prefix cache needs no key (cache_salt separates tenants' caches)"
    ),
}

COMPLETION_UNSUPPORTED: Mapping[str, Unsupported] = {
    **_SAMPLING,
    "add_special_tokens": Unsupported(
        "special tokens are always added to a text prompt; send token ids to choose them",
        (None, True),
    ),
}
"""The fields /v1/completions refuses (CompletionRequest.unsupported_fields)."""

CHAT_UNSUPPORTED: Mapping[str, Unsupported] = {
    **_SAMPLING,
    # vLLM's (`echo`, a field of both endpoints, is refused by the chat request's validator)
    "add_special_tokens": Unsupported("the chat template writes the special tokens", _OFF_FLAG),
    "documents": Unsupported("documents are not passed to the chat template"),
    "media_io_kwargs": Unsupported("media loaders take no per-request arguments", _OFF_MAP),
    "reasoning_effort": Unsupported("reasoning effort is not implemented"),
    "include_reasoning": Unsupported("leaving the reasoning out is not implemented", (None, True)),
    "return_prompt_text": Unsupported("the rendered prompt is not returned", _OFF_FLAG),
    # OpenAI's
    "store": Unsupported("completions are not stored", _OFF_FLAG),
    "metadata": Unsupported("completions are not stored, so take no metadata", _OFF_MAP),
    "service_tier": Unsupported("there is one service tier", (None, "auto", "default")),
    "modalities": Unsupported("the output is text only", (None, ["text"])),
    "audio": Unsupported("audio output is not implemented"),
    "prediction": Unsupported("predicted outputs are not implemented"),
    "web_search_options": Unsupported("web search is not implemented"),
    "verbosity": Unsupported("verbosity is not implemented"),
    "functions": Unsupported("the deprecated functions are not implemented; send tools"),
    "function_call": Unsupported(
        "the deprecated function_call is not implemented; send tool_choice", (None, "none")
    ),
}
"""The fields /v1/chat/completions refuses (ChatCompletionRequest.unsupported_fields)."""

STREAM_OPTIONS_UNSUPPORTED: Mapping[str, Unsupported] = {
    "include_obfuscation": Unsupported("stream obfuscation is not implemented", _OFF_FLAG),
}
"""The stream_options fields refused (OpenAI's)."""
