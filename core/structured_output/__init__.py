"""Structured output: grammars that constrain what a request may generate.

The engine core compiles each request's grammar off the step loop and sends a token
bitmask with each step (`StructuredOutputManager`); workers mask their logits with it
(`apply_grammar_bitmask`). The xgrammar backend lives in `xgrammar_backend` and is
imported only when a grammar is first compiled, so importing this package stays cheap.
"""

from core.structured_output.bitmask import (
    apply_grammar_bitmask,
    grammar_bitmask_tensor,
    pack_grammar_bitmask,
)
from core.structured_output.manager import StructuredOutputManager

__all__ = [
    "StructuredOutputManager",
    "apply_grammar_bitmask",
    "grammar_bitmask_tensor",
    "pack_grammar_bitmask",
]
