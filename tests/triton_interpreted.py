"""What the Triton kernel plugins' tests share: a private copy of a kernel module whose
kernels run in Triton's CPU interpreter, the comparison with an op's reference, and the
check that a kernel compiles for the GPUs it targets without one.

The interpreter replaces compilation when TRITON_INTERPRET=1 at the moment `@triton.jit`
decorates a kernel, so a test loads its own copy of the module with the variable set,
independent of any copy already imported (which stays compiled for the GPU). Import
triton itself before calling this: triton decorates its own @jit helpers at import, and
interpreted ones would break every compiled kernel later in the process.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

import pytest
import torch

from core.ops.samples import Tolerance

# GPU targets the kernels must compile for, with their shared memory per block: an H100
# (sm90, 227 KiB) and an MI300 (gfx942, 64 KiB).
GPU_TARGETS = ("sm90", "gfx942")


def load_interpreted(module_name: str) -> ModuleType:
    """`module_name` loaded again as "_<last part>_interpreted", with TRITON_INTERPRET=1."""
    origin = importlib.util.find_spec(module_name).origin
    name = f"_{module_name.rpartition('.')[2]}_interpreted"
    spec = importlib.util.spec_from_file_location(name, origin)
    module = importlib.util.module_from_spec(spec)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRITON_INTERPRET", "1")
        patch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up
        spec.loader.exec_module(module)
    return module


def assert_matches(
    out: torch.Tensor, want: torch.Tensor, tolerances: Mapping[torch.dtype, Tolerance], label=""
) -> None:
    """`out` equals the reference's `want` within the op's tolerance for want's dtype."""
    assert out.dtype == want.dtype and out.shape == want.shape, label
    tolerance = tolerances[want.dtype]
    torch.testing.assert_close(out.cpu(), want, rtol=tolerance.rtol, atol=tolerance.atol,
                               msg=lambda message: f"{label}: {message}")  # fmt: skip


def compiles_within_shared_memory(
    kernel: Any, constexprs: Mapping[str, Any], pointer_type: Callable[[str], str], target: str
) -> bool:
    """Whether `kernel` (a @triton.jit function) compiles for GPU_TARGETS' `target` with
    `constexprs`, its `*_ptr` parameters of `pointer_type(name)` ("*fp32"...) and the
    others int32, within the target's shared memory."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    gpu, shared_memory = {
        "sm90": (GPUTarget("cuda", 90, 32), 227 * 1024),
        "gfx942": (GPUTarget("hip", "gfx942", 64), 64 * 1024),
    }[target]
    types = {
        name: "constexpr"
        if name in constexprs
        else pointer_type(name)
        if name.endswith("_ptr")
        else "i32"
        for name in inspect.signature(kernel.fn).parameters
    }
    source = ASTSource(fn=kernel, signature=types, constexprs=dict(constexprs))
    return triton.compile(source, target=gpu).metadata.shared <= shared_memory
