"""Kernel ops declared by core; plugins register faster kernels for them.

Each op is a torch.library custom op in the "core" namespace with a pure-PyTorch
reference and a fake for tracing (see `core.ops.registry`). A plugin registers a kernel
from its `core.general` entry point:

    from core.ops import register_impl
    register_impl("rms_norm", "cpu", my_rms_norm, provider="my-plugin")

`providers()` says which provider serves each op on each device type, `provider(op,
device_type)` one of them.
"""

from core.ops.linear import linear, linear_reference
from core.ops.norm import (
    fused_add_rms_norm,
    fused_add_rms_norm_reference,
    rms_norm,
    rms_norm_reference,
)
from core.ops.quant_linear import quant_linear, quant_linear_reference
from core.ops.registry import CORE_OPS, REFERENCE, KernelOp, OpRegistry

register_impl = CORE_OPS.register_impl
providers = CORE_OPS.providers
provider = CORE_OPS.provider

__all__ = [
    "CORE_OPS",
    "REFERENCE",
    "KernelOp",
    "OpRegistry",
    "fused_add_rms_norm",
    "fused_add_rms_norm_reference",
    "linear",
    "linear_reference",
    "provider",
    "providers",
    "quant_linear",
    "quant_linear_reference",
    "register_impl",
    "rms_norm",
    "rms_norm_reference",
]
