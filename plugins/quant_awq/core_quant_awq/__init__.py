"""AWQ 4-bit weights for core: the `awq` quantization method (entry point in
`core.quantization`), AutoAWQ's checkpoint layout, `core quantize awq`, and a Triton
kernel for CUDA devices. Kept import-light: core reads CORE_PLUGIN_API here."""

CORE_PLUGIN_API = ">=1.0,<2"
