"""What `LLM.generate` / `LLM.embed` / `LLM.encode` return and `AsyncLLM` streams, shaped like
vLLM's outputs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# One dict per position: token id -> Logprob (the chosen token and the top-k).
PositionLogprobs = dict[int, Logprob]


@dataclass
class CompletionOutput:
    index: int  # which of the request's n samples
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[PositionLogprobs] | None
    finish_reason: str | None = None  # "stop", "length", "abort" or None while running
    stop_reason: int | str | None = None  # the stop string or token id that matched

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    arrival_time: float
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: list[PositionLogprobs | None] | None
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0
    metrics: RequestMetrics | None = None
    # The KV connector's parameters for the client (vLLM's kv_transfer_params), once the
    # request finished on an engine whose connector returns any.
    kv_transfer_params: dict[str, Any] | None = None


@dataclass
class EmbeddingOutput:
    embedding: list[float]  # the pooled vector (float32 values)


@dataclass
class EmbeddingRequestOutput:
    """What `LLM.embed` returns for one prompt (vLLM's shape): the vector at
    `.outputs.embedding`. `outputs` is None only for a request aborted before it was pooled."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: EmbeddingOutput | None
    finished: bool = True


@dataclass
class IOProcessorRequestOutput:
    """What `LLM.encode` returns for one request (vLLM's shape): the IO processor's answer at
    `.outputs`, whatever its `post_process` returned."""

    request_id: str
    outputs: Any
    finished: bool = True
