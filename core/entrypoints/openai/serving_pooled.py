"""What the pooling endpoints share (/v1/embeddings, /classify, /pooling, /score, /rerank):
the model's task checked before anything else, prompts turned into checked engine requests
(a 400 naming the request's own field, nothing queued), and the usage of the outputs."""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping, Sequence
from http import HTTPStatus
from typing import Any, TypeVar

import numpy as np

from core.engine.async_llm import AsyncLLM
from core.engine.processor import PreparedRequest
from core.entrypoints.openai.errors import OpenAIError
from core.entrypoints.openai.params import field_error
from core.entrypoints.openai.protocol import UsageInfo
from core.outputs import PoolingRequestOutput
from core.pooling.params import PoolingParams

__all__ = ["encode_floats", "field_errors", "prepare_inputs", "require_task", "usage"]

_T = TypeVar("_T")
# What the engine's validation names, by the name of the request's field (an `input`
# request: /v1/embeddings, /classify, /pooling).
_INPUT_FIELDS = {
    "prompt": "input",
    **{name: name for name in ("task", "dimensions", "normalize", "use_activation")},
}


def require_task(engine: AsyncLLM, task: str | None, param: str = "model") -> str:
    """`task` (None: the model's default task); a 400 naming it and what the model
    supports unless the model serves it (`param`: the request field to blame)."""
    tasks = engine.processor.pooling_tasks
    try:
        resolved = task or tasks.default
        tasks.require(resolved)
    except ValueError as exc:
        raise OpenAIError(HTTPStatus.BAD_REQUEST, str(exc), param=param) from exc
    return resolved


def field_errors(prepare: Callable[[], _T], renames: Mapping[str, str]) -> _T:
    """`prepare()`, its ValueError a 400 whose param is the request's name for the field
    the message starts with (`renames`: the engine's names -> the request's)."""
    try:
        return prepare()
    except ValueError as exc:
        raise field_error(str(exc), renames) from exc


def prepare_inputs(
    engine: AsyncLLM, prompts: list[str | list[int]], **params: Any
) -> list[PreparedRequest]:
    """Each prompt of a request's `input` as a checked engine request pooled with
    PoolingParams(**params); a 400 naming `input` (or the parameter at fault) when one
    is refused."""
    if not prompts:
        raise OpenAIError(HTTPStatus.BAD_REQUEST, "input must not be empty", param="input")

    def prepare() -> list[PreparedRequest]:
        pooling = PoolingParams(**params)
        return [engine.processor.prepare(prompt, pooling) for prompt in prompts]

    return field_errors(prepare, _INPUT_FIELDS)


def usage(outputs: Sequence[PoolingRequestOutput]) -> UsageInfo:
    """Every output's prompt tokens: pooled requests generate none."""
    num_tokens = sum(len(output.prompt_token_ids) for output in outputs)
    return UsageInfo(prompt_tokens=num_tokens, total_tokens=num_tokens)


def encode_floats(values: list[float] | list[list[float]], encoding_format: str) -> Any:
    """`values` as the request's `encoding_format` asks: the floats themselves, or base64
    of their little-endian float32 bytes (row-major), what the openai client asks for."""
    if encoding_format == "float":
        return values
    return base64.b64encode(np.asarray(values, dtype="<f4").tobytes()).decode("ascii")
