"""Structured output: grammars that constrain what a request may generate.

The engine core compiles each request's grammar off the step loop and sends a token
bitmask with each step (`StructuredOutputManager`, packed by `pack_grammar_bitmask`);
workers mask their logits with it (`core.worker.grammar_bitmask`). The xgrammar backend
lives in `xgrammar_backend` and is imported only when a grammar is first compiled, so
importing this package stays cheap.
"""

from core.structured_output.bitmask import pack_grammar_bitmask
from core.structured_output.manager import StructuredOutputManager

__all__ = ["StructuredOutputManager", "pack_grammar_bitmask"]
