"""A Triton kernel for core's packed 4/8-bit weights (`core::quant_linear`) on CUDA.

Kept import-light (the plugin loader reads CORE_PLUGIN_API from here, and every process
that runs a model calls the `core.general` entry point `core_quant_triton.ops:register`):
the kernel, which needs triton, lives in `core_quant_triton.kernels`, imported at first use.
"""

CORE_PLUGIN_API = ">=1.0,<2"
