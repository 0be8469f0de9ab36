"""A private copy of a Triton kernel module whose kernels run in Triton's CPU interpreter.

The interpreter replaces compilation when TRITON_INTERPRET=1 at the moment `@triton.jit`
decorates a kernel, so a test loads its own copy of the module with the variable set,
independent of any copy already imported (which stays compiled for the GPU). Import
triton itself before calling this: triton decorates its own @jit helpers at import, and
interpreted ones would break every compiled kernel later in the process.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

import pytest


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
