"""Which runner serves a model (`--runner`), and what pooling asks of the engine config.

A checkpoint is served by the pooling runner when its architecture cannot generate (its
model class sets `pooling_only`: an encoder such as BERT, or a decoder saved without its
LM head) or it carries a sentence-transformers config (`modules.json`); otherwise by the
generate runner. An
explicit `--runner` wins. The pooler config (`--pooler-config`) is filled from the
sentence-transformers config, else from the architecture's `default_pooling_type` (CLS
for BERT, LAST for the decoders) with normalization on, as vLLM embeds.

What pooling changes in the engine (rules of core.config_rules): a pooled request samples
nothing, so there is no speculative decoding; LoRA, pipeline stages and compilation are not
built for it yet. CLS and MEAN pooling, and bidirectional attention, need every prompt token
computed in the forward that pools it (`whole_prompt_reason`), as does a model with a
token-wise task (an output per prompt token): for them prefix caching and chunked prefill
are off (refused when asked for). LAST pooling over a causal decoder keeps both: the last
token is always computed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from core.config import EngineConfig, PoolerConfig
from core.pooling.interface import PoolingType
from core.pooling.params import TOKEN_WISE_TASKS
from core.pooling.st_config import SentenceTransformersConfig, read_sentence_transformers_config

if TYPE_CHECKING:
    from core.model_loader.checkpoint import Checkpoint

__all__ = ["CheckpointPooling", "resolve_runner", "whole_prompt_reason"]

Runner = Literal["generate", "pooling"]


@dataclass(frozen=True)
class CheckpointPooling:
    """What a checkpoint says about pooling, read by the frontend before the config exists.

    `model_cls` attributes read (all optional): `pooling_only` (no language-model head:
    the model can only be pooled), `bidirectional` (its attention sees the whole prompt:
    an encoder), `default_pooling_type` (a PoolingType name; LAST when absent) and
    `pooling_tasks` (core.pooling.tasks; embed when absent).
    """

    architecture: str
    pooling_only: bool
    bidirectional: bool
    default_pooling_type: PoolingType
    sentence_transformers: SentenceTransformersConfig | None
    pooling_tasks: tuple[str, ...] = ("embed",)

    @classmethod
    def read(
        cls, checkpoint: Checkpoint, model_cls: type, runner: str | None = None
    ) -> CheckpointPooling:
        """ValueError naming the file when its sentence-transformers config cannot be served.
        With `runner` "generate" (given explicitly) that config is not read: generation
        does not use it."""
        reads_st = checkpoint.path.is_dir() and runner != "generate"
        directory = checkpoint.path if reads_st else None
        return cls(
            architecture=checkpoint.hf_config["architectures"][0],
            pooling_only=bool(getattr(model_cls, "pooling_only", False)),
            bidirectional=bool(getattr(model_cls, "bidirectional", False)),
            default_pooling_type=PoolingType(getattr(model_cls, "default_pooling_type", "LAST")),
            sentence_transformers=(
                None if directory is None else read_sentence_transformers_config(directory)
            ),
            pooling_tasks=tuple(getattr(model_cls, "pooling_tasks", ("embed",))),
        )

    @property
    def runner(self) -> Runner:
        """The runner `--runner auto` picks."""
        embeds = self.pooling_only or self.sentence_transformers is not None
        return "pooling" if embeds else "generate"


def resolve_runner(config: EngineConfig, pooling: CheckpointPooling) -> None:
    """Resolve `--runner auto` from the checkpoint and, for the pooling runner, fill the
    pooler config from it. What conflicts with the runner is refused by core.config_rules."""
    model = config.model
    if model.runner == "auto":
        model.runner = pooling.runner
    if model.runner == "pooling":
        config.pooler = _pooler_config(config.pooler or PoolerConfig(), pooling)


def whole_prompt_reason(config: EngineConfig, pooling: CheckpointPooling | None) -> str | None:
    """Why the pooling runner needs every prompt token's hidden state from the forward that
    pools it (so no prefix caching, no chunked prefill), or None when it does not."""
    if config.model.runner != "pooling" or config.pooler is None or pooling is None:
        return None
    if pooling.bidirectional:
        return f"{pooling.architecture}'s bidirectional attention"
    token_wise = [task for task in pooling.pooling_tasks if task in TOKEN_WISE_TASKS]
    if token_wise:
        return f"{pooling.architecture}'s {token_wise[0]} task (an output per prompt token)"
    pooling_type = PoolingType(config.pooler.pooling_type)
    return f"{pooling_type.value} pooling" if pooling_type.needs_whole_prompt else None


def _pooler_config(pooler: PoolerConfig, pooling: CheckpointPooling) -> PoolerConfig:
    """`pooler` with what it leaves unset filled from the checkpoint."""
    st = pooling.sentence_transformers
    pooling_type = pooling.default_pooling_type if st is None else st.pooling_type
    pooler.set_default("pooling_type", pooling_type.value)
    pooler.set_default("normalize", True if st is None else st.normalize)
    return pooler
