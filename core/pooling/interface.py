"""The pooler interface: one step's hidden states -> one output per finished prompt.

A model runner with a Pooler (`--runner pooling`) samples nothing: each request whose
prompt the step completes gets its pooled vector instead, and finishes. The reference
implementation is `core.pooling.pooler.ReferencePooler`.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from core.pooling.params import PoolingParams

__all__ = ["Pooler", "PoolingSpans", "PoolingType"]


class PoolingType(str, enum.Enum):
    """Which hidden states make the vector (vLLM's names)."""

    CLS = "CLS"  # the first token's ([CLS] of a BERT encoder)
    MEAN = "MEAN"  # the mean over every prompt token
    LAST = "LAST"  # the last token's (decoder embedders: Qwen3-Embedding, E5-Mistral)

    @property
    def needs_whole_prompt(self) -> bool:
        """Whether every prompt token's hidden state must come from one forward: CLS and
        MEAN read tokens a chunked prefill or a prefix-cache hit would not compute in the
        step that finishes the prompt; LAST reads only the last one, always computed."""
        return self is not PoolingType.LAST


@dataclass(frozen=True)
class PoolingSpans:
    """Where the requests to pool sit in the step's hidden states.

    Request i's tokens this step are rows [starts[i], ends[i]) and end with its prompt's
    last token. For CLS and MEAN pooling the span is the whole prompt (the engine
    configuration guarantees it: see `PoolingType.needs_whole_prompt`).
    """

    starts: torch.Tensor  # [N] int64
    ends: torch.Tensor  # [N] int64


class Pooler(ABC):
    """Turns the hidden states of a step into one vector per finished prompt.

    Runs in the worker of the last pipeline stage, after the forward, on the device.
    """

    @abstractmethod
    def pool(
        self,
        hidden: torch.Tensor,  # [T, hidden_size]: the step's last hidden states
        spans: PoolingSpans,
        params: Sequence[PoolingParams],  # [N]: request i's knobs
    ) -> list[torch.Tensor]:
        """Request i's output, float32 and flat, as its task (`params[i].task`, see
        core.pooling.tasks) asks: embed [params[i].dimensions or hidden_size], the pooled
        hidden states cut to `dimensions`, then L2-normalized when `params[i].normalize`
        (None: the pooler's own default) says so; classify and score [num_labels];
        token_classify [num_span_tokens * num_labels], row-major."""
