"""Pooling tasks: what a pooled request asks of a model, which a served model supports, and
what each task's output is (vLLM's task names).

- `embed`: one vector per prompt (the pooled hidden states, normalized or not).
- `classify`: the classifier head's class probabilities (softmax over the labels; a
  sigmoid when there is one label).
- `score`: a text pair's relevance. A cross-encoder (a classifier with one label) scores
  the pair encoded together: the sigmoid of its logit, as vLLM's default for one-label
  cross-encoders, or the logit itself where the checkpoint's sentence-transformers config
  says Identity (`score_uses_sigmoid`). An embedding model scores the cosine of the two
  texts' embeddings (the engine embeds each text; core.entrypoints.scoring pairs them).
- `token_classify`: the classifier head on every prompt token: [num_tokens, num_labels]
  with the classify activation (vLLM's reward outputs, `LLM.reward`).

A model class lists its tasks in `pooling_tasks` (default: embed only), the first one its
default; `ModelTasks` is that list as a served model has it, and says in vLLM's words why
a task is refused. `score` is offered by an embedding model, and by a classifier only with
exactly one label (vLLM: "Scoring API is only enabled for num_labels == 1").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from core.outputs import (
    ClassificationOutput,
    ClassificationRequestOutput,
    EmbeddingOutput,
    EmbeddingRequestOutput,
    PoolingOutput,
    PoolingRequestOutput,
    ScoringOutput,
    ScoringRequestOutput,
)
from core.pooling.params import POOLING_TASKS, TOKEN_WISE_TASKS, PoolingTask

__all__ = [
    "POOLING_TASKS",
    "TOKEN_WISE_TASKS",
    "ModelTasks",
    "PoolingTask",
    "num_labels",
    "score_uses_sigmoid",
    "task_output",
]

# sentence-transformers' cross-encoder activations core applies: sigmoid or none.
_SCORE_ACTIVATIONS = {"Sigmoid": True, "Identity": False}


def score_uses_sigmoid(hf_config: Mapping[str, Any]) -> bool:
    """Whether a one-label cross-encoder scores with the sigmoid of its logit (vLLM's
    default) or with the logit itself, as the checkpoint's sentence-transformers activation
    says when it names one (`sentence_transformers.activation_fn`, else
    `sbert_ce_default_activation_function`: "torch.nn.modules.linear.Identity", ...).
    ValueError naming the key for an activation core does not apply."""
    st_config = hf_config.get("sentence_transformers") or {}
    for key, name in (
        ("sentence_transformers.activation_fn", st_config.get("activation_fn")),
        (
            "sbert_ce_default_activation_function",
            hf_config.get("sbert_ce_default_activation_function"),
        ),
    ):
        if name is None:
            continue
        short = str(name).rsplit(".", 1)[-1]
        if short not in _SCORE_ACTIVATIONS:
            raise ValueError(
                f"config {key} {name!r}: a cross-encoder's activation must be one of "
                f"{list(_SCORE_ACTIVATIONS)}"
            )
        return _SCORE_ACTIVATIONS[short]
    return True


def num_labels(hf_config: Mapping[str, Any]) -> int:
    """How many labels a classifier's config.json declares: its `id2label` entries, else
    `num_labels`, else transformers' default of 2."""
    id2label = hf_config.get("id2label")
    if id2label:
        return len(id2label)
    return int(hf_config.get("num_labels", 2))


@dataclass(frozen=True)
class ModelTasks:
    """The pooling tasks a served model supports, its default first; `runner` is how it is
    served ("generate": no pooling task at all)."""

    supported: tuple[PoolingTask, ...]
    runner: str = "pooling"
    # Why a task the architecture has is not offered by this checkpoint.
    withheld: Mapping[str, str] = field(default_factory=dict)
    # A classifier's label names by index (config.json's id2label); empty when unnamed.
    labels: tuple[str, ...] = ()

    @classmethod
    def of(cls, model_cls: type, hf_config: Mapping[str, Any], runner: str) -> ModelTasks:
        """The tasks of `model_cls` (its `pooling_tasks`, embed when it lists none) as the
        checkpoint `hf_config` has them, served by `runner`."""
        if runner != "pooling":
            return cls((), runner)
        tasks: tuple[PoolingTask, ...] = tuple(getattr(model_cls, "pooling_tasks", ("embed",)))
        if "embed" in tasks and "score" not in tasks:
            tasks = (*tasks, "score")  # bi-encoder scoring: the cosine of two embeddings
        if "classify" not in tasks:
            return cls(tasks, runner)
        score_uses_sigmoid(hf_config)  # an activation core does not apply stops the start
        names = _label_names(hf_config)
        count = num_labels(hf_config)
        if count != 1 and "score" in tasks:
            reason = f"Scoring API is only enabled for num_labels == 1 (this model has {count})"
            kept = tuple(t for t in tasks if t != "score")
            return cls(kept, runner, {"score": reason}, names)
        return cls(tasks, runner, labels=names)

    @property
    def default(self) -> PoolingTask:
        """The task of a pooled request that names none."""
        if not self.supported:
            raise ValueError(self._refusal("embed"))
        return self.supported[0]

    @property
    def cross_encoder(self) -> bool:
        """Whether `score` runs the pair through the model together (a classifier), rather
        than comparing two embeddings."""
        return "score" in self.supported and "classify" in self.supported

    def require(self, task: str) -> None:
        """ValueError naming `task` and the supported ones unless the model supports it."""
        if task not in self.supported:
            raise ValueError(self._refusal(task))

    def _refusal(self, task: str) -> str:
        if task not in POOLING_TASKS:
            return f"Unsupported task: {task!r}; pooling tasks are {list(POOLING_TASKS)}"
        if self.runner != "pooling":
            return (
                f"this model is served with --runner generate: it cannot {task} (Unsupported "
                f"task: {task!r}. Supported tasks: ['generate']); start it with --runner pooling"
            )
        reason = self.withheld.get(task)
        suffix = f" ({reason})" if reason else ""
        return f"Unsupported task: {task!r}. Supported tasks: {list(self.supported)}{suffix}"


def _label_names(hf_config: Mapping[str, Any]) -> tuple[str, ...]:
    """id2label's names in index order (its keys are strings in config.json)."""
    id2label = hf_config.get("id2label") or {}
    return tuple(str(id2label[key]) for key in sorted(id2label, key=int))


def task_output(
    task: PoolingTask,
    request_id: str,
    prompt: str | None,
    prompt_token_ids: list[int],
    values: Sequence[float] | None,
) -> PoolingRequestOutput:
    """The request output of a pooled request of `task` whose engine output is `values`
    (None: aborted before it was pooled). Token-wise outputs cross the engine flattened
    (row-major, one row per prompt token) and are reshaped here."""
    output: Any = None
    if values is not None:
        output = _task_value(task, values, len(prompt_token_ids))
    kind = _OUTPUT_CLASSES[task]
    return kind(request_id, prompt, prompt_token_ids, output)


def _task_value(task: PoolingTask, values: Sequence[float], num_tokens: int) -> Any:
    if task == "embed":
        return EmbeddingOutput(list(values))
    if task == "classify":
        return ClassificationOutput(list(values))
    if task == "score":
        return ScoringOutput(values[0])
    return PoolingOutput(torch.tensor(values, dtype=torch.float32).reshape(num_tokens, -1))


_OUTPUT_CLASSES: dict[str, type[PoolingRequestOutput]] = {
    "embed": EmbeddingRequestOutput,
    "classify": ClassificationRequestOutput,
    "score": ScoringRequestOutput,
    "token_classify": PoolingRequestOutput,
}
