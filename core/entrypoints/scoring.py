"""Scoring text pairs, as `LLM.score`, `/score` and `/rerank` ask (vLLM's rules).

`text_1` and `text_2` (a text or a list each) make pairs 1:1, 1:N (the one `text_1` with
each of `text_2`) or N:N (element-wise). A cross-encoder (a one-label classifier) runs each
pair through the model together, encoded as its tokenizer joins pairs, and scores it with
the sigmoid of its logit (vLLM's default; core.pooling.tasks). An embedding model embeds
every text once per position and scores each pair with the cosine of its two embeddings
(vLLM's bi-encoder scoring). Every engine request is prepared, and so checked, before any
is queued.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
import torch
import torch.nn.functional as F

from core.engine.processor import InputProcessor, PreparedRequest
from core.outputs import (
    EmbeddingRequestOutput,
    PoolingRequestOutput,
    ScoringOutput,
    ScoringRequestOutput,
)
from core.pooling.params import PoolingParams

__all__ = ["ScoringPlan", "plan_scores", "score_pairs"]


def score_pairs(text_1: str | Sequence[str], text_2: str | Sequence[str]) -> list[tuple[str, str]]:
    """The (text_1, text_2) pairs to score, in order; ValueError naming the field for an
    empty side or lengths that are not 1:1, 1:N or N:N."""
    first = _texts(text_1, "text_1")
    second = _texts(text_2, "text_2")
    if not first:
        raise ValueError("text_1: at least one text element must be given")
    if not second:
        raise ValueError("text_2: at least one text_pair element must be given")
    if len(first) > 1 and len(first) != len(second):
        raise ValueError(
            f"text_1 and text_2: input lengths must be either 1:1, 1:N or N:N, "
            f"got {len(first)}:{len(second)}"
        )
    return list(zip(first * len(second) if len(first) == 1 else first, second, strict=True))


@dataclass
class ScoringPlan:
    """The engine requests that score `pairs`, and how their outputs become scores."""

    pairs: list[tuple[str, str]]
    prepared: list[PreparedRequest]
    cross_encoder: bool

    def finish(self, outputs: Sequence[PoolingRequestOutput]) -> list[ScoringRequestOutput]:
        """One score per pair, in order, from the finished `outputs` of `prepared`."""
        if self.cross_encoder:
            return list(outputs)  # ScoringRequestOutputs (core.pooling.tasks.task_output)
        count = len(self.pairs)
        firsts, seconds = outputs[: len(outputs) - count], outputs[len(outputs) - count :]
        return [
            _cosine(firsts[0] if len(firsts) == 1 else firsts[i], seconds[i]) for i in range(count)
        ]


def plan_scores(
    processor: InputProcessor,
    text_1: str | Sequence[str],
    text_2: str | Sequence[str],
    params: PoolingParams | None = None,
) -> ScoringPlan:
    """The checked engine requests scoring text_1 against text_2 on the model `processor`
    serves; ValueError naming the task when it does not score, or naming the input."""
    processor.pooling_tasks.require("score")
    params = params or PoolingParams()
    if params.task not in (None, "score"):
        raise ValueError(f"task {params.task!r}: scoring runs the task 'score'")
    pairs = score_pairs(text_1, text_2)
    if processor.pooling_tasks.cross_encoder:
        scored = msgspec.structs.replace(params, task="score")
        prepared = [processor.prepare_pair(a, b, scored) for a, b in pairs]
        return ScoringPlan(pairs, prepared, cross_encoder=True)
    embed = msgspec.structs.replace(params, task="embed")
    firsts = _texts(text_1, "text_1")
    texts = [*firsts, *(b for _, b in pairs)]
    return ScoringPlan(pairs, [processor.prepare(text, embed) for text in texts], False)


def _texts(texts: str | Sequence[str], field: str) -> list[str]:
    given = [texts] if isinstance(texts, str) else list(texts)
    bad = [text for text in given if not isinstance(text, str)]
    if bad:
        raise ValueError(f"{field} must be a text or a list of texts, got {bad[0]!r:.40}")
    return given


def _cosine(a: EmbeddingRequestOutput, b: EmbeddingRequestOutput) -> ScoringRequestOutput:
    """A bi-encoder's score of a pair: the cosine of its two embeddings."""
    if a.outputs is None or b.outputs is None:
        return ScoringRequestOutput(f"{a.request_id}_{b.request_id}", None, [], None)
    u, v = torch.tensor(a.outputs.embedding), torch.tensor(b.outputs.embedding)
    score = F.cosine_similarity(u, v, dim=0).item()
    return ScoringRequestOutput(
        f"{a.request_id}_{b.request_id}",
        None,
        a.prompt_token_ids + b.prompt_token_ids,
        ScoringOutput(score),
    )
