"""Speculative decoding for core (not implemented yet).

Registers no entry points until it has a component it can honour.
"""

CORE_PLUGIN_API = ">=1.0,<2"
