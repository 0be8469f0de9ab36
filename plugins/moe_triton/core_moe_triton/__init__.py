"""A Triton kernel for core's fused mixture-of-experts MLP (`core::fused_moe`) on CUDA.

Kept import-light (the plugin loader reads CORE_PLUGIN_API from here, and every process
that runs a model calls the `core.general` entry point `core_moe_triton.ops:register`):
the kernels, which need triton, live in `core_moe_triton.kernels`, imported at first use.
"""

CORE_PLUGIN_API = ">=1.0,<2"
