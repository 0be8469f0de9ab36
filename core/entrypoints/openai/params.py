"""OpenAI request -> SamplingParams.

Precedence for every sampling field: the value the request set (None counts as unset),
else the model's default (``defaults``: the generation_config values, keyed by
SamplingParams field names), else SamplingParams' own default. Every invalid value comes
out as a 400 OpenAIError whose ``param`` (and message) use the request's own field name,
e.g. ``max_completion_tokens`` or ``response_format`` rather than SamplingParams' name.

Length (the fit rule, `core.request.fit_max_tokens`): an explicit request for more tokens
than the context has room for (``max_model_len - prompt_len``) is an error, as with
OpenAI; a default (16 for completions, the model's ``max_tokens``) is silently capped to
that room; ``None`` means all of it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from core.entrypoints.openai.errors import OpenAIError
from core.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from core.input_checks import first_few
from core.request import fit_max_tokens
from core.sampling_params import SamplingParams, StructuredOutputsParams

__all__ = ["chat_sampling_params", "completion_sampling_params", "field_error"]

# Request fields with the same name and meaning in SamplingParams.
_SHARED_FIELDS = (
    "n",
    "temperature",
    "top_p",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "seed",
    "top_k",
    "min_p",
    "repetition_penalty",
    "ignore_eos",
    "min_tokens",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "include_stop_str_in_output",
    "stop_token_ids",
    "allowed_token_ids",
    "bad_words",
)

# Request fields that each name one structured-output constraint.
_GUIDED_FIELDS = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}

# A token id: an int64 has at most 19 digits (a longer key would also be slow to convert).
_TOKEN_ID_KEY = re.compile(r"[0-9]{1,19}")


def completion_sampling_params(
    req: CompletionRequest,
    max_model_len: int,
    prompt_len: int,
    defaults: Mapping[str, Any] | None = None,
) -> SamplingParams:
    """SamplingParams of one prompt of a /v1/completions request.

    ``echo`` with ``logprobs`` also asks for prompt logprobs (unless ``prompt_logprobs``
    says how many), so the echoed prompt carries them as OpenAI's does. Raises OpenAIError
    (400) naming the offending field.
    """
    explicit = "max_tokens" in req.model_fields_set
    max_tokens = _max_tokens(
        req.max_tokens, "max_tokens", explicit, defaults, max_model_len, prompt_len, "prompt"
    )
    chosen = {
        "max_tokens": max_tokens,
        "logprobs": req.logprobs,
        "prompt_logprobs": req.prompt_logprobs,
    }
    if req.echo and req.logprobs is not None and req.prompt_logprobs is None:
        chosen["prompt_logprobs"] = req.logprobs
    return _build(req, chosen, defaults, renames={})


def chat_sampling_params(
    req: ChatCompletionRequest,
    max_model_len: int,
    prompt_len: int,
    defaults: Mapping[str, Any] | None = None,
) -> SamplingParams:
    """SamplingParams of a /v1/chat/completions request (``prompt_len``: the templated
    conversation's tokens). Raises OpenAIError (400) naming the offending field."""
    if req.max_completion_tokens is not None:
        name, requested = "max_completion_tokens", req.max_completion_tokens
    else:
        name, requested = "max_tokens", req.max_tokens
    max_tokens = _max_tokens(
        requested, name, requested is not None, defaults, max_model_len, prompt_len, "messages"
    )
    chosen = {
        "max_tokens": max_tokens,
        "logprobs": (req.top_logprobs or 0) if req.logprobs else None,
        "prompt_logprobs": req.prompt_logprobs,
    }
    return _build(req, chosen, defaults, renames={"max_tokens": name, "logprobs": "top_logprobs"})


def _max_tokens(
    requested: int | None,
    name: str,
    explicit: bool,
    defaults: Mapping[str, Any] | None,
    max_model_len: int,
    prompt_len: int,
    prompt_field: str,
) -> int:
    if not explicit and defaults and defaults.get("max_tokens") is not None:
        requested = defaults["max_tokens"]
    try:
        return fit_max_tokens(requested, prompt_len, max_model_len, exact=explicit)
    except ValueError as exc:
        raise field_error(str(exc), {"prompt": prompt_field, "max_tokens": name}) from exc


def _build(
    req: CompletionRequest | ChatCompletionRequest,
    chosen: dict[str, Any],
    defaults: Mapping[str, Any] | None,
    renames: dict[str, str],
) -> SamplingParams:
    """SamplingParams from the request's shared fields, ``chosen`` (fields the caller
    resolved) and ``defaults`` under both; a ValueError names the request's field."""
    values = {name: getattr(req, name) for name in _SHARED_FIELDS}
    values.update(chosen)
    values["logit_bias"] = _logit_bias(req.logit_bias)
    values["structured_outputs"] = _structured_outputs(req)
    values["extra_args"] = _extra_args(req)
    kwargs = {**(defaults or {}), **{k: v for k, v in values.items() if v is not None}}
    try:
        return SamplingParams(**kwargs)
    except ValueError as exc:
        raise field_error(str(exc), renames) from exc


def _extra_args(req: CompletionRequest | ChatCompletionRequest) -> dict[str, Any] | None:
    """SamplingParams.extra_args: vLLM's ``vllm_xargs`` (what custom logits processors
    read), and the KV connector's ``kv_transfer_params``, which only its own field sets."""
    extra = dict(req.vllm_xargs or {})
    if "kv_transfer_params" in extra:
        raise _bad_request(
            "vllm_xargs must not hold kv_transfer_params; send the kv_transfer_params field",
            "vllm_xargs",
        )
    if req.kv_transfer_params is not None:
        extra["kv_transfer_params"] = req.kv_transfer_params
    return extra or None


def _logit_bias(logit_bias: dict[str, float] | None) -> dict[int, float] | None:
    if logit_bias is None:
        return None
    bad = [key for key in logit_bias if not _TOKEN_ID_KEY.fullmatch(key)]
    if bad:  # vLLM's words; its int() also takes "-1" and " 3", which no token id is spelt as
        raise _bad_request(
            "logit_bias contains key(s) that cannot be converted to integer token IDs: "
            + first_few(bad),
            "logit_bias",
        )
    return {int(key): bias for key, bias in logit_bias.items()}


def _structured_outputs(
    req: CompletionRequest | ChatCompletionRequest,
) -> StructuredOutputsParams | None:
    """The request's one structured-output constraint, whichever field set it."""
    found: list[tuple[str, dict[str, Any]]] = []
    if req.structured_outputs is not None:
        fields = req.structured_outputs.model_dump(by_alias=True, exclude_none=True)
        found.append(("structured_outputs", fields))
    for field, key in _GUIDED_FIELDS.items():
        if getattr(req, field) is not None:
            found.append((field, {key: getattr(req, field)}))
    response_format = req.response_format
    if response_format is not None and response_format.type == "json_object":
        found.append(("response_format", {"json_object": True}))
    if response_format is not None and response_format.json_schema is not None:
        found.append(("response_format", {"json": response_format.json_schema.schema_}))
    if not found:
        return None
    if len(found) > 1:
        names = " and ".join(name for name, _ in found)
        raise _bad_request(
            f"only one structured output constraint is allowed, got {names}", found[1][0]
        )
    source, fields = found[0]
    try:
        return StructuredOutputsParams(**fields)
    except ValueError as exc:
        raise _bad_request(f"invalid {source}: {exc}", source) from exc


def field_error(message: str, renames: Mapping[str, str]) -> OpenAIError:
    """A 400 for a ValueError of the engine's validation. Its message starts with the field
    it names (SamplingParams and the InputProcessor both write them so); the ``param`` and
    the message say the request's own name for it (``renames``: e.g. prompt -> messages).
    A message that starts with neither a SamplingParams field nor a renamed one gets no
    ``param``."""
    field = re.match(r"[a-z_][a-z0-9_]*", message)
    name = field.group(0) if field else None
    if name not in SamplingParams.__struct_fields__ and name not in renames:
        return _bad_request(message, None)
    param = renames.get(name, name)
    return _bad_request(param + message[len(name) :], param)


def _bad_request(message: str, param: str | None) -> OpenAIError:
    return OpenAIError(HTTPStatus.BAD_REQUEST, message, param=param)
