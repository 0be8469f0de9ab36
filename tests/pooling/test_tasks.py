"""Pooling tasks: which a served model offers (and vLLM's words when it refuses one), the
fields each task reads, the engine settings a token-wise task needs, and the output kind
each task's values become."""

from __future__ import annotations

import pytest

from core.engine_args import EngineArgs
from core.outputs import (
    ClassificationRequestOutput,
    EmbeddingRequestOutput,
    PoolingRequestOutput,
    ScoringRequestOutput,
)
from core.platforms.cpu import CpuPlatform
from core.pooling.interface import PoolingType
from core.pooling.params import PoolingParams
from core.pooling.runner import CheckpointPooling
from core.pooling.tasks import ModelTasks, score_uses_sigmoid, task_output

CLASSIFIER_TASKS = ("classify", "score", "token_classify")


class Embedder:
    pass


class Classifier:
    pooling_tasks = CLASSIFIER_TASKS


def three_labels() -> dict:
    return {"id2label": {"0": "neg", "1": "neu", "2": "pos"}}


def test_an_embedding_model_embeds_and_scores_by_default_with_embed():
    tasks = ModelTasks.of(Embedder, {}, "pooling")
    assert (tasks.supported, tasks.default, tasks.cross_encoder) == (
        ("embed", "score"),
        "embed",
        False,
    )


def test_a_one_label_classifier_is_a_cross_encoder_and_names_its_label():
    tasks = ModelTasks.of(Classifier, {"id2label": {"0": "relevant"}}, "pooling")
    assert tasks.supported == CLASSIFIER_TASKS and tasks.cross_encoder
    assert (tasks.default, tasks.labels) == ("classify", ("relevant",))


def test_a_classifier_with_several_labels_does_not_score_and_says_why():
    tasks = ModelTasks.of(Classifier, three_labels(), "pooling")
    assert tasks.supported == ("classify", "token_classify")
    assert tasks.labels == ("neg", "neu", "pos")
    with pytest.raises(ValueError) as error:
        tasks.require("score")
    assert str(error.value) == (
        "Unsupported task: 'score'. Supported tasks: ['classify', 'token_classify'] "
        "(Scoring API is only enabled for num_labels == 1 (this model has 3))"
    )


def test_an_embedding_model_refuses_to_classify_naming_what_it_supports():
    with pytest.raises(
        ValueError, match=r"Unsupported task: 'classify'. Supported tasks: \['embed', 'score'\]"
    ):
        ModelTasks.of(Embedder, {}, "pooling").require("classify")


def test_a_generating_model_refuses_every_pooling_task_naming_it_and_the_runner():
    tasks = ModelTasks.of(Classifier, {}, "generate")
    with pytest.raises(
        ValueError, match=r"--runner generate: it cannot score \(Unsupported task: 'score'"
    ):
        tasks.require("score")
    with pytest.raises(ValueError, match="it cannot embed"):
        _ = tasks.default


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (
            PoolingParams(task="classify", dimensions=8),
            r"dimensions: task 'classify' only supports \['use_activation'\]",
        ),
        (
            PoolingParams(task="score", normalize=True),
            r"normalize: task 'score' only supports \['use_activation'\]",
        ),
        (
            PoolingParams(use_activation=False),
            r"use_activation: task 'embed' only supports \['dimensions', 'normalize'\]",
        ),
    ],
)
def test_a_field_the_task_does_not_read_is_refused_by_name(params, message):
    with pytest.raises(ValueError, match=message):
        params.verify(32, None)


def test_an_unknown_task_is_refused_on_construction():
    with pytest.raises(
        ValueError, match=r"task must be one of \['embed', 'classify', 'score', 'token_classify'\]"
    ):
        PoolingParams(task="reward")


def test_a_model_with_a_token_wise_task_turns_prefix_caching_and_chunked_prefill_off():
    pooling = CheckpointPooling(
        "LlamaForSequenceClassification", True, False, PoolingType.LAST, None, CLASSIFIER_TASKS
    )
    config = EngineArgs().create_engine_config(CpuPlatform(), model_max_len=64, pooling=pooling)
    assert not config.cache.enable_prefix_caching
    assert not config.scheduler.enable_chunked_prefill
    with pytest.raises(
        ValueError, match="token_classify task .an output per prompt token. needs every"
    ):
        EngineArgs(enable_prefix_caching=True).create_engine_config(
            CpuPlatform(), model_max_len=64, pooling=pooling
        )


def test_each_task_gives_its_output_kind_and_token_wise_values_get_their_rows_back():
    ids = [5, 6, 7]
    embed = task_output("embed", "a", "w", ids, [0.5, 0.5])
    classify = task_output("classify", "b", None, ids, [0.25, 0.75])
    score = task_output("score", "c", None, ids, [0.9])
    rows = task_output("token_classify", "d", None, ids, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    assert isinstance(embed, EmbeddingRequestOutput) and embed.outputs.embedding == [0.5, 0.5]
    assert isinstance(classify, ClassificationRequestOutput)
    assert (classify.outputs.probs, classify.outputs.num_classes) == ([0.25, 0.75], 2)
    assert isinstance(score, ScoringRequestOutput) and score.outputs.score == 0.9
    assert type(rows) is PoolingRequestOutput
    assert rows.outputs.data.tolist() == [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]
    aborted = task_output("classify", "e", None, ids, None)
    assert isinstance(aborted, ClassificationRequestOutput) and aborted.outputs is None


@pytest.mark.parametrize(
    ("hf_config", "sigmoid"),
    [
        ({}, True),
        ({"sbert_ce_default_activation_function": "torch.nn.modules.linear.Identity"}, False),
        ({"sentence_transformers": {"activation_fn": "torch.nn.modules.activation.Sigmoid"}}, True),
    ],
)
def test_a_cross_encoder_scores_with_the_activation_its_config_names(hf_config, sigmoid):
    assert score_uses_sigmoid(hf_config) is sigmoid


def test_an_activation_core_does_not_apply_stops_the_classifier():
    config = {"sbert_ce_default_activation_function": "torch.nn.modules.activation.Tanh"}
    with pytest.raises(ValueError, match="config sbert_ce_default_activation_function 'torch.nn"):
        ModelTasks.of(Classifier, config, "pooling")
