"""Paged attention for core in Triton kernels: the `flash` attention backend.

Kept import-light (the plugin loader reads CORE_PLUGIN_API from here): the backend class
lives in `core_attn_flash.backend`, the kernels, which need triton, in
`core_attn_flash.kernels`.
"""

CORE_PLUGIN_API = ">=1.0,<2"
