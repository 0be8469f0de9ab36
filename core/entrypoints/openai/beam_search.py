"""vLLM's `use_beam_search`: a completion or chat answered by beam search (core.beam_search)
instead of sampling.

As vLLM maps a request: the beam width is `n` and each of the `n` best beams is a choice,
best first; `max_tokens` (or `max_completion_tokens`), `temperature` (the request's, else
the model's default, else 1.0: it samples the one token each beam's step generates),
`ignore_eos`, `length_penalty` and `include_stop_str_in_output` shape the search. The
other sampling fields mean nothing to it, so a request setting one (to anything but its
default) is refused with a 400 naming it rather than answered as if it were not there;
so is `length_penalty` without `use_beam_search`. A completion is not streamed, as vLLM
does not stream one (it answers whole): `stream` is refused; a chat stream carries each
beam whole in one chunk (vLLM's).
"""

from __future__ import annotations

from http import HTTPStatus

from core.beam_search import BeamSearchParams, check_beam_width
from core.entrypoints.openai import protocol as p
from core.entrypoints.openai.errors import OpenAIError
from core.entrypoints.openai.params import field_error
from core.sampling_params import SamplingParams

__all__ = ["beam_search_params"]

# The request fields beam search has no use for (it ranks the model's own logprobs).
_UNUSED = (
    "stop", "stop_token_ids", "top_p", "top_k", "min_p", "presence_penalty",
    "frequency_penalty", "repetition_penalty", "logit_bias", "seed", "min_tokens",
    "bad_words", "allowed_token_ids", "skip_special_tokens", "spaces_between_special_tokens",
    "response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice",
    "guided_grammar", "logprobs", "top_logprobs", "prompt_logprobs", "kv_transfer_params",
    "vllm_xargs", "tools", "tool_choice",
)  # fmt: skip


def beam_search_params(
    req: p.CompletionRequest | p.ChatCompletionRequest, params: SamplingParams, max_logprobs: int
) -> BeamSearchParams | None:
    """The beam search `req` asks for, None for sampling; `params` are its SamplingParams
    (validated, max_tokens fitted to the context). A 400 naming the field the search
    cannot honour, or `n` when its beams ask more candidates than `max_logprobs` (the
    server's --max-logprobs)."""
    if not req.use_beam_search:
        if req.length_penalty != 1.0:
            raise _refused("length_penalty", "only applies to beam search (use_beam_search)")
        return None
    for name in _UNUSED:
        if _is_set(req, name):
            raise _refused(name, "is not used by beam search (use_beam_search)")
    if isinstance(req, p.CompletionRequest) and req.stream:
        raise _refused("stream", "beam search answers a completion whole; send stream false")
    try:
        search = BeamSearchParams(
            beam_width=params.n,
            max_tokens=params.max_tokens,
            ignore_eos=params.ignore_eos,
            temperature=params.temperature,
            length_penalty=req.length_penalty,
            include_stop_str_in_output=params.include_stop_str_in_output,
        )
        check_beam_width(search, max_logprobs)
    except ValueError as exc:
        renames = {"beam_width": "n", "length_penalty": "length_penalty"}
        raise field_error(str(exc), renames) from exc
    return search


def _is_set(req: p.CompletionRequest | p.ChatCompletionRequest, name: str) -> bool:
    """Whether the request sent `name` with a value other than its default."""
    field = type(req).model_fields.get(name)
    return field is not None and getattr(req, name) != field.get_default(call_default_factory=True)


def _refused(name: str, reason: str) -> OpenAIError:
    return OpenAIError(HTTPStatus.BAD_REQUEST, f"{name} {reason}", param=name)
