"""PoolingParams: the per-request knobs of a pooled request (vLLM's PoolingParams).

A msgspec Struct because it crosses the frontend -> engine-core socket inside an
EngineCoreRequest, as SamplingParams does; ``__post_init__`` runs on decode too, so a
malformed message fails with the same ValueError as a bad Python call. Checks that need
model facts (the embedding size, the Matryoshka sizes) live in ``verify``.

`PoolingTask` lives here, with the field that carries it, so that the scheduler <-> worker
contract stays light; what each task means is core.pooling.tasks'.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, get_args

import msgspec

__all__ = ["POOLING_TASKS", "TOKEN_WISE_TASKS", "PoolingParams", "PoolingTask"]

PoolingTask = Literal["embed", "classify", "score", "token_classify"]
POOLING_TASKS: tuple[str, ...] = get_args(PoolingTask)
# Tasks with an output per prompt token: every token's hidden state must come from the
# forward that pools the prompt (core.pooling.runner.whole_prompt_reason).
TOKEN_WISE_TASKS: frozenset[str] = frozenset({"token_classify"})

# The fields each task reads (vLLM refuses the others the same way).
_TASK_FIELDS = {
    "embed": ("dimensions", "normalize"),
    "classify": ("use_activation",),
    "score": ("use_activation",),
    "token_classify": ("use_activation",),
}
_TASK_FIELD_NAMES = ("dimensions", "normalize", "use_activation")


class PoolingParams(msgspec.Struct, kw_only=True, omit_defaults=True):
    """How one request is pooled.

    task: what the request asks (core.pooling.tasks); None: the model's default task.
    dimensions (embed): keep only the first `dimensions` values (a Matryoshka embedding);
        when the vector is normalized, it is normalized after the cut, so it stays a unit
        vector.
    normalize (embed): L2-normalize the vector; None: as the model's pooler config says
        (the checkpoint's sentence-transformers Normalize module, or `--pooler-config`).
    use_activation (classify, score, token_classify): apply the task's activation to the
        classifier's logits (softmax, or a sigmoid for one label); None: yes. False gives
        the raw logits.
    second_text_start: set by the frontend for a pair scored by a cross-encoder whose
        tokens have types: where the second text starts in the prompt (its tokens are of
        type 1, BERT's segment B); None: every token is of type 0.
    """

    task: PoolingTask | None = None
    dimensions: int | None = None
    normalize: bool | None = None
    use_activation: bool | None = None
    second_text_start: int | None = None

    def __post_init__(self) -> None:
        if self.task is not None and self.task not in POOLING_TASKS:
            raise ValueError(f"task must be one of {list(POOLING_TASKS)}, got {self.task!r}")
        dims = self.dimensions
        if dims is not None and (isinstance(dims, bool) or dims < 1):
            raise ValueError(f"dimensions must be an integer >= 1, got {dims!r}")
        start = self.second_text_start
        if start is not None and (isinstance(start, bool) or start < 1):
            raise ValueError(f"second_text_start must be an integer >= 1, got {start!r}")

    def verify(self, hidden_size: int, matryoshka_dimensions: Sequence[int] | None) -> None:
        """ValueError naming a field the request's task (embed when None) does not read,
        or naming `dimensions` when the model cannot give that many values: more than its
        `hidden_size`, or a size its checkpoint does not list among its
        `matryoshka_dimensions` (when it lists them)."""
        self._check_task_fields()
        dims = self.dimensions
        if dims is None:
            return
        if dims > hidden_size:
            raise ValueError(
                f"dimensions must be <= the model's embedding size {hidden_size}, got {dims}"
            )
        if matryoshka_dimensions and dims not in matryoshka_dimensions:
            raise ValueError(
                f"dimensions must be one of the model's matryoshka_dimensions "
                f"{list(matryoshka_dimensions)}, got {dims}"
            )

    def _check_task_fields(self) -> None:
        task = self.task or "embed"
        allowed = _TASK_FIELDS[task]
        given = [n for n in _TASK_FIELD_NAMES if n not in allowed and getattr(self, n) is not None]
        if given:
            raise ValueError(
                f"{given[0]}: task {task!r} only supports {list(allowed)} parameters, not {given}"
            )
