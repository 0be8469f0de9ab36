"""What an IOProcessor's `pre_process` returned, as the arguments of engine requests.

The shape is checked here, once, for `LLM.encode`, the server and the conformance kit: a
shape outside the contract (interface.ProcessorPrompt) is the processor's bug, so it is a
TypeError naming `pre_process` (a server error), never a client's 400. What the prompt says
(empty text, ids outside the vocabulary, an image too large) is the engine's to check.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from core.io_processors.interface import ProcessorPrompt

__all__ = ["PromptParts", "is_token_ids", "prompt_parts"]

_KEYS = frozenset({"prompt", "prompt_token_ids", "multi_modal_data"})


class PromptParts(NamedTuple):
    """One engine request's input, as `InputProcessor.prepare` takes it."""

    prompt: str | list[int]
    multi_modal_data: Mapping[str, Any] | None = None


def prompt_parts(returned: ProcessorPrompt | Sequence[ProcessorPrompt]) -> list[PromptParts]:
    """One PromptParts per prompt of `returned` (a prompt, or a non-empty sequence of them),
    in order; TypeError naming pre_process for anything else."""
    if _is_single(returned):
        return [_parts(returned)]  # type: ignore[arg-type]
    if not isinstance(returned, Sequence) or isinstance(returned, bytes) or not returned:
        raise TypeError(
            "pre_process must return a prompt or a non-empty sequence of prompts, got "
            f"{_describe(returned)}"
        )
    return [_parts(prompt) for prompt in returned]


def _is_single(value: object) -> bool:
    """Whether `value` is one prompt (text, a dict, token ids) rather than a sequence."""
    return isinstance(value, str | Mapping) or (bool(value) and is_token_ids(value))


def _parts(prompt: object) -> PromptParts:
    if isinstance(prompt, str) or is_token_ids(prompt):
        return PromptParts(prompt)  # type: ignore[arg-type]
    if not isinstance(prompt, Mapping):
        raise TypeError(
            f"pre_process returned a prompt that is not text, token ids or a dict: "
            f"{_describe(prompt)}"
        )
    unknown = sorted(set(prompt) - _KEYS)
    if unknown:
        raise TypeError(f"pre_process returned a prompt dict with unknown keys {unknown}")
    if ("prompt" in prompt) == ("prompt_token_ids" in prompt):
        raise TypeError(
            "pre_process returned a prompt dict that needs exactly one of 'prompt' (text) "
            "and 'prompt_token_ids'"
        )
    text, token_ids = prompt.get("prompt"), prompt.get("prompt_token_ids")
    if "prompt" in prompt and not isinstance(text, str):
        raise TypeError(f"pre_process returned a 'prompt' that is not text: {_describe(text)}")
    if "prompt_token_ids" in prompt and not is_token_ids(token_ids):
        raise TypeError(
            f"pre_process returned 'prompt_token_ids' that are not a list of ints: "
            f"{_describe(token_ids)}"
        )
    mm_data = prompt.get("multi_modal_data")
    if mm_data is not None and not isinstance(mm_data, Mapping):
        raise TypeError(
            "pre_process returned multi_modal_data that is not a dict of modality -> items: "
            f"{_describe(mm_data)}"
        )
    return PromptParts(text if token_ids is None else list(token_ids), mm_data)


def is_token_ids(value: object) -> bool:
    """A list of ints (bools are not token ids)."""
    return isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value
    )


def _describe(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"
