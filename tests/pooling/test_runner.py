"""--runner and --pooler-config: resolved from what the checkpoint says, with the engine
settings pooling needs; conflicting flags are refused by name."""

from __future__ import annotations

import pytest
from checkpoint_pooling import BERT, DECODER, LAST_TOKEN_EMBEDDER, MEAN_DECODER

from core.config import CUDAGraphMode
from core.engine_args import EngineArgs
from core.platforms.cpu import CpuPlatform
from core.pooling.runner import CheckpointPooling


def config(pooling: CheckpointPooling, platform=None, **args):
    return EngineArgs(**args).create_engine_config(
        platform or CpuPlatform(), model_max_len=64, pooling=pooling
    )


def test_a_plain_decoder_generates():
    resolved = config(DECODER)
    assert (resolved.model.runner, resolved.pooler) == ("generate", None)


def test_an_encoder_is_pooled_by_its_architectures_default_and_normalized():
    resolved = config(BERT)
    assert resolved.model.runner == "pooling"
    assert (resolved.pooler.pooling_type, resolved.pooler.normalize) == ("CLS", True)


def test_a_sentence_transformers_config_picks_pooling_and_normalization():
    resolved = config(MEAN_DECODER)
    assert resolved.model.runner == "pooling"
    assert (resolved.pooler.pooling_type, resolved.pooler.normalize) == ("MEAN", False)


def test_an_explicit_runner_wins_over_the_checkpoint():
    assert config(LAST_TOKEN_EMBEDDER, runner="generate").pooler is None
    pooled = config(DECODER, runner="pooling").pooler
    assert (pooled.pooling_type, pooled.normalize) == ("LAST", True)


def test_pooler_config_fields_given_win_and_the_rest_come_from_the_checkpoint():
    pooler = config(BERT, pooler_config='{"pooling_type": "MEAN"}').pooler
    assert (pooler.pooling_type, pooler.normalize) == ("MEAN", True)
    with pytest.raises(ValueError, match="pooling_type"):
        config(BERT, pooler_config='{"pooling_type": "MAX"}')


def test_bidirectional_attention_and_mean_pooling_compute_whole_prompts():
    for pooling in (BERT, MEAN_DECODER):
        resolved = config(pooling)
        assert not resolved.cache.enable_prefix_caching
        assert not resolved.scheduler.enable_chunked_prefill
        assert resolved.scheduler.max_num_batched_tokens >= resolved.model.max_model_len


def test_last_token_pooling_of_a_decoder_keeps_prefix_caching_and_chunking():
    resolved = config(LAST_TOKEN_EMBEDDER)
    assert resolved.cache.enable_prefix_caching and resolved.scheduler.enable_chunked_prefill


@pytest.mark.parametrize(
    ("pooling", "args", "message"),
    [
        (BERT, {"runner": "generate"}, "--runner generate: BertModel has no language-model head"),
        (DECODER, {"pooler_config": "{}"}, "--pooler-config applies to --runner pooling only"),
        (BERT, {"enable_prefix_caching": True}, "--enable-prefix-caching: BertModel's bidirec"),
        (MEAN_DECODER, {"enable_chunked_prefill": True}, "--enable-chunked-prefill: MEAN pool"),
        (BERT, {"enable_lora": True}, "--enable-lora with --runner pooling is not built"),
        (
            LAST_TOKEN_EMBEDDER,
            {"speculative_config": '{"method": "ngram", "num_speculative_tokens": 2}'},
            "--speculative-config with --runner pooling",
        ),
        (BERT, {"optimization_level": 1}, "-O1: pooling models .* run eagerly"),
    ],
)
def test_flags_that_conflict_with_the_runner_are_refused_by_name(pooling, args, message):
    with pytest.raises(ValueError, match=message):
        config(pooling, **args)


def test_a_platforms_default_compilation_is_dropped_for_pooling():
    class CompilingPlatform(CpuPlatform):
        supported_optimization_levels = (0, 1, 2)
        default_optimization_level = 2

    resolved = config(LAST_TOKEN_EMBEDDER, platform=CompilingPlatform())
    compilation = resolved.compilation
    assert compilation.level == 2
    assert not (compilation.compile_model or compilation.capture_graphs)
    assert compilation.cudagraph_mode is CUDAGraphMode.NONE
    assert config(DECODER, platform=CompilingPlatform()).compilation.compile_model


def test_what_a_checkpoint_says_is_read_from_its_model_class_and_files(tmp_path):
    from types import SimpleNamespace

    from core.models.bert import BertModel
    from core.models.llama import LlamaForCausalLM

    bert = SimpleNamespace(path=tmp_path, hf_config={"architectures": ["BertModel"]})
    assert CheckpointPooling.read(bert, BertModel) == BERT
    (tmp_path / "modules.json").write_text("not json")
    llama = SimpleNamespace(path=tmp_path, hf_config={"architectures": ["LlamaForCausalLM"]})
    with pytest.raises(ValueError, match="modules.json is not readable JSON"):
        CheckpointPooling.read(llama, LlamaForCausalLM)
    # Generation does not read it: a checkpoint may ship one it does not need.
    assert CheckpointPooling.read(llama, LlamaForCausalLM, runner="generate") == DECODER
    gguf = SimpleNamespace(path=tmp_path / "m.gguf", hf_config=llama.hf_config)
    assert CheckpointPooling.read(gguf, LlamaForCausalLM) == DECODER
