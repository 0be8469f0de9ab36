"""Architecture lookup through the `core.models` entry-point group."""

from __future__ import annotations

import importlib.metadata as metadata

import pytest
from plugin_sources import API

from core.models import resolve_model_class
from core.models.llama import LlamaForCausalLM
from core.models.qwen3 import Qwen3ForCausalLM
from core.plugins import PluginRegistry
from core.plugins.groups import ALL_GROUPS, MODELS

# What the `core` distribution declares (pyproject.toml) for its built-in models.
CORE_MODELS = {
    "LlamaForCausalLM": "core.models.llama:LlamaForCausalLM",
    "MistralForCausalLM": "core.models.mistral:MistralForCausalLM",
    "Qwen2ForCausalLM": "core.models.qwen2:Qwen2ForCausalLM",
    "Qwen3ForCausalLM": "core.models.qwen3:Qwen3ForCausalLM",
}


def core_registry() -> PluginRegistry:
    points = [metadata.EntryPoint(name, value, MODELS) for name, value in CORE_MODELS.items()]
    return PluginRegistry(points, allowlist=None)


def installed_registry() -> PluginRegistry:
    points = [ep for group in ALL_GROUPS for ep in metadata.entry_points(group=group)]
    core_points = [metadata.EntryPoint(n, v, MODELS) for n, v in CORE_MODELS.items()]
    return PluginRegistry(points + core_points, allowlist=None)


def test_architecture_resolves_to_its_class():
    assert resolve_model_class(["Qwen3ForCausalLM"], core_registry()) is Qwen3ForCausalLM


def test_first_supported_architecture_wins():
    names = ["FancyNewForCausalLM", "LlamaForCausalLM", "Qwen3ForCausalLM"]
    assert resolve_model_class(names, core_registry()) is LlamaForCausalLM


def test_unknown_architecture_lists_the_supported_ones():
    with pytest.raises(ValueError) as info:
        resolve_model_class(["GPT2LMHeadModel"], core_registry())
    message = str(info.value)
    assert "['GPT2LMHeadModel'] are not supported" in message
    assert all(name in message for name in CORE_MODELS)


def test_plugin_distribution_adds_an_architecture(site):
    modules = {
        "acme_models/__init__.py": API,
        "acme_models/acme.py": """
            from core.models.llama import DecoderOptions, LlamaForCausalLM

            class AcmeForCausalLM(LlamaForCausalLM):
                @classmethod
                def decoder_options(cls, config):
                    return DecoderOptions(qk_norm=True)
        """,
    }
    site.add("acme-models", {MODELS: {"AcmeForCausalLM": "acme_models.acme:AcmeForCausalLM"}},
             modules)  # fmt: skip

    cls = resolve_model_class(["AcmeForCausalLM"], installed_registry())

    assert cls.__name__ == "AcmeForCausalLM" and issubclass(cls, LlamaForCausalLM)


def test_architecture_whose_plugin_fails_to_import_says_why(site):
    modules = {"broken_models/__init__.py": API,
               "broken_models/model.py": "raise ImportError('needs libacme')\n"}  # fmt: skip
    site.add("broken-models", {MODELS: {"BrokenForCausalLM": "broken_models.model:Broken"}},
             modules)  # fmt: skip

    with pytest.raises(ValueError, match=r"BrokenForCausalLM \(failed: .*needs libacme\)"):
        resolve_model_class(["BrokenForCausalLM"], installed_registry())
