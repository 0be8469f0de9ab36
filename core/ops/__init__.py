"""Kernel ops declared by core; plugins register faster kernels for them.

Each op is a torch.library custom op in the "core" namespace with a pure-PyTorch
reference, a fake for tracing, and conformance samples with per-dtype tolerances (see
`core.ops.registry` and `core.ops.samples`). A plugin registers a kernel from its
`core.general` entry point:

    from core.ops import register_impl
    register_impl("rms_norm", "cpu", my_rms_norm, provider="my-plugin")

`providers()` says which provider serves each op on each device type, `provider(op,
device_type)` one of them.
"""

from core.ops.activation import silu_and_mul, silu_and_mul_reference
from core.ops.fp8_linear import fp8_linear, fp8_linear_reference
from core.ops.fused_moe import check_fused_moe_args, fused_moe, fused_moe_reference
from core.ops.int8_linear import int8_linear, int8_linear_reference
from core.ops.linear import linear, linear_reference
from core.ops.norm import (
    fused_add_rms_norm,
    fused_add_rms_norm_reference,
    rms_norm,
    rms_norm_reference,
)
from core.ops.quant_linear import quant_linear, quant_linear_reference
from core.ops.registry import CORE_OPS, REFERENCE, KernelOp, OpRegistry
from core.ops.rotary import apply_rotary_emb, rotary_embedding, rotary_embedding_reference
from core.ops.samples import Conformance, OpSample, SampleBuilder, Tolerance

register_impl = CORE_OPS.register_impl
providers = CORE_OPS.providers
provider = CORE_OPS.provider

__all__ = [
    "CORE_OPS",
    "Conformance",
    "REFERENCE",
    "KernelOp",
    "OpRegistry",
    "OpSample",
    "SampleBuilder",
    "Tolerance",
    "apply_rotary_emb",
    "check_fused_moe_args",
    "fp8_linear",
    "fp8_linear_reference",
    "fused_add_rms_norm",
    "fused_add_rms_norm_reference",
    "fused_moe",
    "fused_moe_reference",
    "int8_linear",
    "int8_linear_reference",
    "linear",
    "linear_reference",
    "provider",
    "providers",
    "quant_linear",
    "quant_linear_reference",
    "register_impl",
    "rms_norm",
    "rms_norm_reference",
    "rotary_embedding",
    "rotary_embedding_reference",
    "silu_and_mul",
    "silu_and_mul_reference",
]
