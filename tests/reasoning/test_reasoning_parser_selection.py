"""--reasoning-parser NAME: core's parsers come through the `core.reasoning_parsers`
entry-point group like a plugin's, and an unknown name is refused at start, naming the
flag and the parsers installed."""

from __future__ import annotations

import pytest
from think_vocab import think_tokenizer
from tiny_engine_checkpoint import engine_kwargs, write_tiny_checkpoint

from core import LLM
from core.config import UsageContext
from core.engine_args import EngineArgs
from core.platforms.cpu import CpuPlatform
from core.plugins.registry import PluginRegistry
from core.reasoning import ReasoningParser, build_reasoning_parser, reasoning_parser_class
from core.reasoning.deepseek_r1 import DeepSeekR1ReasoningParser
from core.reasoning.qwen3 import Qwen3ReasoningParser


@pytest.mark.parametrize(
    ("name", "cls"), [("deepseek_r1", DeepSeekR1ReasoningParser), ("qwen3", Qwen3ReasoningParser)]
)
def test_cores_parsers_are_entry_points(name, cls):
    assert reasoning_parser_class(name) is cls


def test_an_unknown_parser_is_refused_at_start_naming_the_flag_and_the_installed_ones():
    args = EngineArgs(reasoning_parser="nope")
    with pytest.raises(ValueError) as error:
        args.create_engine_config(CpuPlatform(), model_max_len=64, usage=UsageContext.SERVING)
    message = str(error.value)
    assert message.startswith("--reasoning-parser: reasoning parser 'nope' is not installed")
    assert "deepseek_r1, qwen3" in message


def test_the_parser_reaches_the_engine_config():
    config = EngineArgs(reasoning_parser="qwen3").create_engine_config(
        CpuPlatform(), model_max_len=64
    )
    assert config.structured_outputs.reasoning_parser == "qwen3"


def test_a_model_whose_tokenizer_lacks_the_markers_is_refused_at_start(tmp_path):
    model_dir = write_tiny_checkpoint(tmp_path)  # a word-level vocabulary: no <think>
    with pytest.raises(ValueError) as error:
        LLM(**engine_kwargs(model_dir, reasoning_parser="deepseek_r1"))
    assert str(error.value).startswith("--reasoning-parser deepseek_r1: the tokenizer has no")


def test_a_plugins_parser_is_found_by_its_entry_name(site):
    site.add(
        "acme-reasoning",
        {"core.reasoning_parsers": {"acme": "acme_reasoning:AcmeParser"}},
        {
            "acme_reasoning/__init__.py": """
                from core.reasoning import ReasoningParser, ReasoningSplit

                class AcmeParser(ReasoningParser):
                    markers = ("[/THINK]",)

                    def extract_reasoning(self, text):
                        reasoning, _, content = text.partition("[/THINK]")
                        return ReasoningSplit(reasoning or None, content or None)

                    def is_reasoning_end(self, token_ids):
                        return False
            """
        },
    )
    cls = reasoning_parser_class("acme", PluginRegistry.from_environment())
    assert issubclass(cls, ReasoningParser) and cls.__name__ == "AcmeParser"
    assert cls(think_tokenizer()).extract_reasoning("r[/THINK]c") == ("r", "c")


def test_build_gives_an_instance_over_the_tokenizer():
    tokenizer = think_tokenizer()
    parser = build_reasoning_parser("qwen3", tokenizer)
    assert isinstance(parser, Qwen3ReasoningParser) and parser.tokenizer is tokenizer
