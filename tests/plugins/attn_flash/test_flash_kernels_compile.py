"""The flash kernels compile for real GPU targets, here, without a GPU.

The interpreter runs kernels as numpy and forgives what the compiler does not (a loop
variable changing type, a tile under tl.dot's 16, shared memory over the device's); the
parity tests cannot see those. Triton compiles for a named target without a device (its
wheel carries ptxas and the AMD linker), so each kernel is built here for an H100/H200
(sm_90) and an MI300 (gfx942) at a serving configuration, and must fit in shared memory.
"""

from __future__ import annotations

import inspect

import pytest

pytest.importorskip("core_attn_flash", reason="core-attn-flash is not installed (optional plugin)")
triton = pytest.importorskip("triton", reason="triton is not installed (the flash kernels need it)")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

if triton.knobs.runtime.interpret:
    pytest.skip("TRITON_INTERPRET is set: the kernels are not compiled", allow_module_level=True)

from core_attn_flash import kernels  # noqa: E402

TARGETS = {
    "sm90": (GPUTarget("cuda", 90, 32), 227 * 1024),
    "gfx942": (GPUTarget("hip", "gfx942", 64), 64 * 1024),
}
# Llama-style layer in 16-bit: head size 128, 4 query heads per KV head, blocks of 16.
ATTENTION = dict(HEAD_SIZE=128, GROUP=4, BLOCK_SIZE=16, BLOCK_N=64, BLOCK_D=128)
DTYPE = "bf16"
INDEX_POINTERS = {
    "block_table_ptr": "*i32",
    "query_start_loc_ptr": "*i32",
    "seq_lens_ptr": "*i32",
    "slot_mapping_ptr": "*i64",
    "acc_ptr": "*fp32",
    "maxes_ptr": "*fp32",
    "sums_ptr": "*fp32",
}
KERNELS = {
    "reshape_and_cache": (
        kernels._reshape_and_cache_kernel,
        dict(NUM_KV_HEADS=8, HEAD_SIZE=128, BLOCK_SIZE=16, BLOCK_T=4, BLOCK_D=128, BLOCK_HD=1024),
    ),
    "unified_prefill": (
        kernels._unified_attention_kernel,
        dict(ATTENTION, BLOCK_M=64, BLOCK_Q=16, USE_WINDOW=True, UPCAST=False),
    ),
    "unified_decode": (
        kernels._unified_attention_kernel,
        dict(ATTENTION, BLOCK_M=16, BLOCK_Q=4, USE_WINDOW=False, UPCAST=False),
    ),
    "split_kv_decode": (
        kernels._split_kv_decode_kernel,
        dict(ATTENTION, BLOCK_M=16, NUM_SPLITS=16, USE_WINDOW=True, UPCAST=False),
    ),
    "split_kv_reduce": (
        kernels._split_kv_reduce_kernel,
        dict(HEAD_SIZE=128, BLOCK_D=128, NUM_SPLITS=16),
    ),
}


def signature(kernel, constexprs: dict) -> dict[str, str]:
    """Triton types of the kernel's parameters: the constexprs given, index pointers as
    named above, other pointers of the activation dtype, the scale float, the rest int."""
    types = {}
    for name in inspect.signature(kernel.fn).parameters:
        if name in constexprs:
            types[name] = "constexpr"
        elif name.endswith("_ptr"):
            types[name] = INDEX_POINTERS.get(name, f"*{DTYPE}")
        else:
            types[name] = "fp32" if name == "qk_scale" else "i32"
    return types


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", KERNELS)
def test_kernel_compiles_for_gpu_target_within_shared_memory(name, target):
    kernel, constexprs = KERNELS[name]
    gpu, shared_memory = TARGETS[target]
    source = ASTSource(fn=kernel, signature=signature(kernel, constexprs), constexprs=constexprs)
    compiled = triton.compile(source, target=gpu)
    assert compiled.metadata.shared <= shared_memory
