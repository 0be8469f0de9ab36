"""LLM.encode with the `words` IO processor plugin (tests/plugin_sources.py) on the tiny
model: the answer is what generate gives the processor's prompts, requests batch, and
refused data leaves the engine serving with nothing queued."""

from __future__ import annotations

import json

import pytest
from plugin_sources import WORDS_IO_ENTRY_POINTS, words_io_processor
from tiny_engine_checkpoint import engine_kwargs, write_tiny_checkpoint

from core import LLM, SamplingParams
from core.outputs import IOProcessorRequestOutput

GREEDY = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def words_plugin(site, fresh_registry) -> None:
    site.add("acme-words-io", WORDS_IO_ENTRY_POINTS, words_io_processor())


def continuations(llm: LLM, prompts: list[str], params: SamplingParams = GREEDY) -> list[str]:
    return [o.outputs[0].text for o in llm.generate(prompts, params, use_tqdm=False)]


def test_encode_answers_with_what_generate_gives_each_prompt(model_dir, words_plugin):
    llm = LLM(**engine_kwargs(model_dir, io_processor_plugin="words"))
    first, second = llm.encode(
        [{"data": {"words": ["w1", "w5"]}}, {"data": {"words": ["w7"]}}], use_tqdm=False
    )
    assert isinstance(first, IOProcessorRequestOutput) and first.finished
    assert first.outputs == {"answer": continuations(llm, ["w1", "w5"])}
    assert second.outputs == {"answer": continuations(llm, ["w7"])}
    assert first.request_id != second.request_id
    one_token = SamplingParams(temperature=0.0, max_tokens=1)
    (short,) = llm.encode({"data": {"words": ["w1"]}}, one_token, use_tqdm=False)
    assert short.outputs == {"answer": continuations(llm, ["w1"], one_token)}


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        ({"data": {"words": []}}, "data must be"),
        ({"data": {"words": ["w1 w2"]}}, "data.words must be single words"),
        ({"words": ["w1"]}, 'an encode request must be {"data": ...}'),
        ({"data": {"words": ["nope"]}, "priority": 1}, 'an encode request must be {"data": ...}'),
    ],
)
def test_refused_data_queues_nothing_and_the_engine_keeps_serving(
    model_dir, words_plugin, request_, message
):
    llm = LLM(**engine_kwargs(model_dir, io_processor_plugin="words"))
    with pytest.raises(ValueError, match=message):
        llm.encode([{"data": {"words": ["w1"]}}, request_], use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()
    (answer,) = llm.encode({"data": {"words": ["w1"]}}, use_tqdm=False)
    assert answer.outputs == {"answer": continuations(llm, ["w1"])}


def test_config_json_names_the_processor(tmp_path, words_plugin):
    model_dir = write_tiny_checkpoint(tmp_path)
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "io_processor_plugin": "words"}))
    llm = LLM(**engine_kwargs(model_dir))
    (answer,) = llm.encode({"data": {"words": ["w2"]}}, use_tqdm=False)
    assert answer.outputs == {"answer": continuations(llm, ["w2"])}


def test_without_a_processor_encode_says_how_to_configure_one(model_dir):
    llm = LLM(**engine_kwargs(model_dir))
    with pytest.raises(ValueError, match="no IO processor is configured: start the engine with"):
        llm.encode({"data": {"words": ["w1"]}})


def test_a_processor_that_is_not_installed_stops_the_start(model_dir, fresh_registry):
    with pytest.raises(ValueError) as error:
        LLM(**engine_kwargs(model_dir, io_processor_plugin="words"))
    assert str(error.value) == (
        "--io-processor-plugin: IO processor 'words' is not installed; installed: passthrough"
    )
