"""Speculative decoding for core: proposers of draft tokens (`core.spec_proposers`).

`ngram` (prompt lookup, `core_spec_decode.ngram`) drafts the tokens that followed an
earlier copy of a request's last tokens. Verification is core's rejection sampler.
Importing this package imports nothing heavy: core reads CORE_PLUGIN_API first.
"""

CORE_PLUGIN_API = ">=1.0,<2"
