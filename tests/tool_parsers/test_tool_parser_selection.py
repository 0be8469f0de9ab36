"""--tool-call-parser NAME: core's parsers come through the `core.tool_parsers` entry-point
group like a plugin's, and an unknown name is an error naming the flag."""

from __future__ import annotations

import pytest

from core.plugins.registry import PluginRegistry
from core.tool_parsers import ToolParser, tool_parser_class
from core.tool_parsers.hermes import HermesToolParser
from core.tool_parsers.llama3_json import Llama3JsonToolParser
from core.tool_parsers.mistral import MistralToolParser
from core.tool_parsers.pythonic import PythonicToolParser


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("hermes", HermesToolParser),
        ("llama3_json", Llama3JsonToolParser),
        ("mistral", MistralToolParser),
        ("pythonic", PythonicToolParser),
    ],
)
def test_cores_parsers_are_entry_points(name, cls):
    assert tool_parser_class(name) is cls


def test_unknown_parser_names_the_flag_and_what_is_installed():
    with pytest.raises(ValueError) as error:
        tool_parser_class("nope")
    message = str(error.value)
    assert message.startswith("--tool-call-parser: tool parser 'nope' is not installed")
    assert "hermes, llama3_json, mistral, pythonic" in message


def test_a_plugins_parser_is_found_by_its_entry_name(site):
    site.add(
        "acme-tools",
        {"core.tool_parsers": {"acme": "acme_tools:AcmeParser"}},
        {
            "acme_tools/__init__.py": """
                from core.tool_parsers import ExtractedToolCalls, ToolParser

                class AcmeParser(ToolParser):
                    def extract_tool_calls(self, model_output, request):
                        return ExtractedToolCalls(False, [], model_output)

                    def extract_tool_calls_streaming(self, current, delta, request, finished):
                        return None
            """
        },
    )
    cls = tool_parser_class("acme", PluginRegistry.from_environment())
    assert issubclass(cls, ToolParser) and cls.__name__ == "AcmeParser"
