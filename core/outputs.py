"""What `LLM.generate` / `LLM.embed` / `LLM.classify` / `LLM.score` / `LLM.encode` return and
`AsyncLLM` streams, shaped like vLLM's outputs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    import torch


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
class ClassificationOutput:
    probs: list[float]  # one per label (raw logits when the request turned activation off)

    @property
    def num_classes(self) -> int:
        return len(self.probs)


@dataclass
class ScoringOutput:
    score: float  # a text pair's relevance (core.pooling.tasks: how each model scores)


@dataclass
class PoolingOutput:
    data: torch.Tensor  # a token-wise task's output: [num_prompt_tokens, num_labels]


_O = TypeVar("_O")


@dataclass
class PoolingRequestOutput(Generic[_O]):
    """What a pooled prompt gives (vLLM's shape): its task's output at `.outputs`, None
    only for a request aborted before it was pooled. `LLM.encode` returns these."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: _O | None
    finished: bool = True


class EmbeddingRequestOutput(PoolingRequestOutput[EmbeddingOutput]):
    """What `LLM.embed` returns for one prompt: the vector at `.outputs.embedding`."""


class ClassificationRequestOutput(PoolingRequestOutput[ClassificationOutput]):
    """What `LLM.classify` returns for one prompt: the label probabilities at
    `.outputs.probs`."""


class ScoringRequestOutput(PoolingRequestOutput[ScoringOutput]):
    """What `LLM.score` returns for one pair: `.outputs.score`."""


@dataclass
class IOProcessorRequestOutput:
    """What `LLM.encode` returns for one request (vLLM's shape): the IO processor's answer at
    `.outputs`, whatever its `post_process` returned."""

    request_id: str
    outputs: Any
    finished: bool = True
