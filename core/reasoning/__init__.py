"""Reasoning parsers: a reasoning model's thinking told apart from its answer (see
`interface`).

Core's own parsers (`deepseek_r1`, `qwen3`) are entry points of the `core` distribution
in the `core.reasoning_parsers` group, like a plugin's would be.
"""

from core.reasoning.interface import ReasoningParser, ReasoningSplit
from core.reasoning.selector import build_reasoning_parser, reasoning_parser_class
from core.reasoning.stream import ReasoningStream

__all__ = [
    "ReasoningParser",
    "ReasoningSplit",
    "ReasoningStream",
    "build_reasoning_parser",
    "reasoning_parser_class",
]
