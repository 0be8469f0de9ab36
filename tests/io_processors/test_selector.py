"""Which IO processor a model gets: --io-processor-plugin, else config.json's
`io_processor_plugin`, else none; a name that cannot be had is a ValueError saying where it
came from and what is installed, and only the named entry is ever imported."""

from __future__ import annotations

import sys

import pytest
from plugin_sources import API, WORDS_IO_ENTRY_POINTS, words_io_processor

from core.config import EngineConfig, ModelConfig, PoolerConfig
from core.io_processors import (
    IOProcessor,
    io_processor_class,
    load_io_processor,
    require_io_processor,
)
from core.plugins.registry import PluginRegistry

BROKEN = {
    "acme_broken_io/__init__.py": API,
    "acme_broken_io/processor.py": "raise RuntimeError('needs a GPU library')\n",
    "acme_broken_io/not_a_processor.py": "class Echo:\n    pass\n",
}


@pytest.fixture
def installed(site) -> PluginRegistry:
    """The `words` plugin, and a distribution whose two processors cannot load."""
    site.add("acme-words-io", WORDS_IO_ENTRY_POINTS, words_io_processor())
    broken = {
        "broken": "acme_broken_io.processor:Broken",
        "echo": "acme_broken_io.not_a_processor:Echo",
    }
    site.add("acme-broken-io", {"core.io_processors": broken}, BROKEN)
    return PluginRegistry.from_environment()


def named(flag: str | None = None) -> ModelConfig:
    return ModelConfig(io_processor_plugin=flag)


def test_the_flag_names_the_processor(installed):
    cls = io_processor_class(named("words"), {}, installed)
    assert issubclass(cls, IOProcessor) and cls.__name__ == "WordsIOProcessor"


def test_config_json_names_it_when_the_flag_does_not_and_the_flag_wins(installed):
    from_config = io_processor_class(named(), {"io_processor_plugin": "words"}, installed)
    assert from_config.__name__ == "WordsIOProcessor"
    with pytest.raises(ValueError, match=r"^--io-processor-plugin: IO processor 'broken'"):
        io_processor_class(named("broken"), {"io_processor_plugin": "words"}, installed)


def test_nothing_named_is_no_processor_and_imports_nothing(installed):
    assert io_processor_class(named(), {"architectures": ["LlamaForCausalLM"]}, installed) is None
    assert load_io_processor(EngineConfig(), {}, installed) is None
    assert not any(name.startswith("acme_") for name in sys.modules)


def test_none_installed_says_a_plugin_is_needed():
    with pytest.raises(ValueError) as error:
        io_processor_class(named(), {"io_processor_plugin": "words"}, PluginRegistry([], None))
    assert str(error.value) == (
        "config.json's io_processor_plugin 'words': an IO processor plugin is needed but none "
        "is installed (entry-point group core.io_processors)"
    )


def test_an_unknown_name_lists_the_installed_ones_with_why_they_cannot_load(installed):
    with pytest.raises(ValueError, match="needs a GPU library"):
        io_processor_class(named("broken"), {}, installed)
    with pytest.raises(ValueError) as error:
        io_processor_class(named("nope"), {}, installed)
    assert str(error.value) == (
        "--io-processor-plugin: IO processor 'nope' is not installed; installed: broken "
        "(failed: import failed: RuntimeError: needs a GPU library), echo, passthrough, words"
    )


def test_a_failing_plugin_does_not_keep_another_from_loading(installed):
    with pytest.raises(ValueError, match="import failed: RuntimeError"):
        io_processor_class(named("broken"), {}, installed)
    with pytest.raises(ValueError, match="Echo is not a subclass of IOProcessor"):
        io_processor_class(named("echo"), {}, installed)
    assert io_processor_class(named("words"), {}, installed).__name__ == "WordsIOProcessor"


def test_a_filtered_plugin_says_core_plugins_leaves_it_out(site, monkeypatch):
    site.add("acme-words-io", WORDS_IO_ENTRY_POINTS, words_io_processor())
    monkeypatch.setenv("CORE_PLUGINS", "acme-other")
    with pytest.raises(ValueError, match="acme-words-io is not in CORE_PLUGINS"):
        io_processor_class(named("words"), {}, PluginRegistry.from_environment())


@pytest.mark.parametrize("value", [3, "", ["words"]])
def test_config_json_must_hold_a_name(value):
    with pytest.raises(ValueError, match="config.json's io_processor_plugin must name"):
        io_processor_class(named(), {"io_processor_plugin": value}, PluginRegistry([], None))


def test_the_processor_is_built_with_the_engine_config_and_may_refuse_it(installed):
    config = EngineConfig(model=named("words"))
    processor = load_io_processor(config, {}, installed)
    assert processor is not None and processor.config is config
    pooling = EngineConfig(model=named("words"), pooler=PoolerConfig())
    with pytest.raises(ValueError, match="use --runner generate"):
        load_io_processor(pooling, {}, installed)


def test_no_processor_configured_says_how_to_configure_one():
    with pytest.raises(ValueError) as error:
        require_io_processor(None)
    assert str(error.value) == (
        "no IO processor is configured: start the engine with --io-processor-plugin NAME "
        "(entry-point group core.io_processors), or name one in the checkpoint's config.json "
        "io_processor_plugin"
    )
