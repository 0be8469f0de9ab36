"""Bad speculative configurations are ValueErrors naming the field, before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from tiny_engine_checkpoint import reference_model, write_tiny_checkpoint

from core import LLM
from core.config import SpeculativeConfig
from core.engine_args import EngineArgs
from core.plugins.registry import PluginRegistry
from core.spec_decode.selector import proposer_class


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("target"))


def _llm(target: Path, config) -> LLM:
    return LLM(str(target), dtype="float32", max_model_len=32, kv_cache_memory="1MiB",
               speculative_config=config)  # fmt: skip


@pytest.mark.parametrize(
    ("config", "names"),
    [
        ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
        ({"method": "ngram", "num_speculative_tokens": -2}, "num_speculative_tokens"),
        ({"method": "ngram", "num_speculative_tokens": 1.5}, "num_speculative_tokens"),
        ({"method": "ngram"}, "num_speculative_tokens"),
        ({"num_speculative_tokens": 2}, "speculative_config.method"),
        ({}, "speculative_config.method"),
        ({"method": "medusa", "num_speculative_tokens": 2}, "speculative_config.method"),
        (
            {"method": "ngram", "num_speculative_tokens": 2, "lookup": 3},
            "speculative_config.lookup",
        ),
        (
            {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 0},
            "speculative_config.prompt_lookup_min",
        ),
        ({"method": "draft_model", "num_speculative_tokens": 2}, "speculative_config.model"),
        (
            {"method": "draft_model", "model": "/no/such/draft", "num_speculative_tokens": 2},
            "speculative_config.model",
        ),
        (
            {"method": "layer_skip", "num_speculative_tokens": 2, "num_layers": 0},
            "speculative_config.num_layers",
        ),
    ],
)
def test_bad_config_is_a_value_error_naming_the_field(config, names):
    with pytest.raises(ValueError, match=names.replace(".", r"\.")):
        EngineArgs(speculative_config=config).create_engine_config(_cpu())


def test_flag_json_is_parsed_like_the_keyword(target):
    args = EngineArgs(
        model=str(target), speculative_config='{"method": "ngram", "num_speculative_tokens": 3}'
    )
    config = args.create_engine_config(_cpu())
    assert (config.speculative.method, config.speculative.num_speculative_tokens) == ("ngram", 3)
    with pytest.raises(ValueError, match="--speculative-config"):
        EngineArgs(speculative_config="{not json").create_engine_config(_cpu())


def test_a_model_without_a_method_means_draft_model():
    config = SpeculativeConfig.from_json({"model": "x", "num_speculative_tokens": 2})
    assert config.method == "draft_model" and config.options == {"model": "x"}


def test_without_the_plugin_the_error_names_the_package():
    empty = PluginRegistry([], allowlist=None)
    config = SpeculativeConfig(method="ngram", num_speculative_tokens=2)
    with pytest.raises(ValueError, match="pip install core-spec-decode"):
        proposer_class(config, empty)


def test_a_draft_with_another_vocabulary_is_refused(target, tmp_path):
    config = reference_model().config
    config.vocab_size = 64
    other = write_tiny_checkpoint(tmp_path / "other")
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(other)
    with pytest.raises(ValueError, match=r"speculative_config\.model .*vocab_size 64"):
        _llm(target, {"method": "draft_model", "model": str(other), "num_speculative_tokens": 2})


def test_layer_skip_needs_fewer_layers_than_the_target(target):
    with pytest.raises(ValueError, match=r"speculative_config\.num_layers"):
        _llm(target, {"method": "layer_skip", "num_layers": 2, "num_speculative_tokens": 2})


def _cpu():
    from core.platforms.cpu import CpuPlatform

    return CpuPlatform()
