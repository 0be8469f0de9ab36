"""Conformance of a plugin's kernels for core's ops (`--core-conformance=kernels:NAME`).

NAME is a `core.general` entry point (or a `module.path:Attr` callable) that registers
kernels through `core.ops.register_impl`, as core-cpu-kernels' `kernel_ops` does. The kit
calls it (registration callables are re-entrant) and records every op it serves on the
device type under test (--core-conformance-device). For each of those kernels and each
dtype its op states a tolerance for, the op's samples (`core.ops.samples`: one row, odd
sizes, strided views) run through the kernel on the device and through the op's reference
on the CPU. The outputs must agree in dtype and shape and lie within the op's tolerance,
and so must every tensor argument afterwards: an op that writes into its arguments writes
what the reference writes, and one that does not leaves them alone.

Where the target also registered several kernels for an op to be chosen among by
measurement (core.kernel_choice), each available one runs the same samples forced
(CORE_KERNEL_CHOICE): whichever the user's machine picks must equal the reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch

from core.envs import KERNEL_CHOICE_ENV
from core.kernel_choice import KERNEL_CHOICES
from core.ops import CORE_OPS, KernelOp, Tolerance
from core.testing.plugin import targets_of
from core.testing.targets import Target

_CPU = torch.device("cpu")


@dataclass(frozen=True)
class KernelCase:
    """One kernel a target registered, checked in one dtype."""

    op: KernelOp
    device_type: str
    dtype: torch.dtype | None  # None: the op declares no conformance (the test fails)
    candidate: str | None = None  # a kernel-choice candidate forced, else as registered


_served_by: dict[str, list[tuple[KernelOp, str]]] = {}


def _served(target: Target) -> list[tuple[KernelOp, str]]:
    """What `target` registers: (op, device type) pairs, one registration run per target."""
    if target.id not in _served_by:
        _served_by[target.id] = CORE_OPS.registrations_of(target.value)
    return _served_by[target.id]


def _device_type(config: pytest.Config) -> str:
    return torch.device(config.getoption("core_conformance_device")).type


def _cases(target: Target, device_type: str) -> list[Any]:
    params = []
    for op, served_type in _served(target):
        if served_type != device_type:
            continue
        dtypes = list(op.conformance.tolerances) if op.conformance is not None else [None]
        candidates = [c.name for c in KERNEL_CHOICES.candidates.get(op.name, ()) if c.available()]
        for dtype in dtypes:
            dtype_id = str(dtype).removeprefix("torch.")
            for candidate in [None, *candidates]:
                case = KernelCase(op, device_type, dtype, candidate)
                suffix = f"-{candidate}" if candidate else ""
                params.append(pytest.param(case, id=f"{target.id}-{op.name}-{dtype_id}{suffix}"))
    return params


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    targets = targets_of(metafunc.config, "kernels")
    if "kernel_case" in metafunc.fixturenames:
        device_type = _device_type(metafunc.config)
        params = [case for target in targets for case in _cases(target, device_type)]
        metafunc.parametrize("kernel_case", params)
    elif "target" in metafunc.fixturenames:
        metafunc.parametrize("target", [pytest.param(t, id=t.id) for t in targets])


def test_registers_a_kernel_for_the_device_under_test(target: Target, request) -> None:
    device_type = _device_type(request.config)
    served = _served(target)
    listed = ", ".join(f"{op.name} on {served_type}" for op, served_type in served) or "nothing"
    assert any(served_type == device_type for _, served_type in served), (
        f"{target.id} registers no kernel for core's ops on {device_type!r} "
        f"(it registers: {listed}; see --core-conformance-device)"
    )


@pytest.fixture
def forced_candidate(kernel_case: KernelCase, monkeypatch: pytest.MonkeyPatch):
    """Force the case's candidate (if any) for its op, with no choice made before or kept
    after: a problem's kernel stays chosen once looked up."""
    if kernel_case.candidate is not None:
        monkeypatch.setenv(KERNEL_CHOICE_ENV, f"{kernel_case.op.name}={kernel_case.candidate}")
    KERNEL_CHOICES.chosen.clear()
    yield
    KERNEL_CHOICES.chosen.clear()


@pytest.mark.usefixtures("forced_candidate")
def test_kernel_matches_the_reference_on_every_sample(
    kernel_case: KernelCase, core_conformance_device: torch.device
) -> None:
    op, dtype = kernel_case.op, kernel_case.dtype
    assert op.conformance is not None, (
        f"{op.qualname} declares no conformance samples (a dispatch seam, not a kernel op): "
        "nothing can certify a kernel registered for it"
    )
    kernel = op.kernels[kernel_case.device_type]
    tolerance = op.conformance.tolerances[dtype]
    names = [argument.name for argument in op.overload._schema.arguments]
    ours = op.conformance.samples(dtype, core_conformance_device)
    theirs = op.conformance.samples(dtype, _CPU)
    assert ours, f"{op.qualname} has no samples in {dtype}"
    for our_sample, their_sample in zip(ours, theirs, strict=True):
        got, want = kernel(*our_sample.args), op.reference(*their_sample.args)
        what = f"{op.qualname} in {str(dtype).removeprefix('torch.')}, sample {our_sample.name!r}"
        if kernel_case.candidate is not None:
            what += f" ({kernel_case.candidate})"
        _assert_outputs_close(got, want, tolerance, what)
        for name, got_arg, want_arg in zip(names, our_sample.args, their_sample.args, strict=True):
            if isinstance(want_arg, torch.Tensor):
                _assert_close(got_arg, want_arg, tolerance, f"{what}: argument {name!r} afterwards")


def _assert_outputs_close(got: Any, want: Any, tolerance: Tolerance, what: str) -> None:
    got_tensors, want_tensors = _tensors(got), _tensors(want)
    assert len(got_tensors) == len(want_tensors), (
        f"{what}: {len(got_tensors)} outputs, the reference gives {len(want_tensors)}"
    )
    for i, (g, w) in enumerate(zip(got_tensors, want_tensors, strict=True)):
        _assert_close(g, w, tolerance, f"{what}: output {i}")


def _tensors(result: Any) -> list[torch.Tensor]:
    if result is None:
        return []
    return [result] if isinstance(result, torch.Tensor) else list(result)


def _assert_close(got: Any, want: torch.Tensor, tolerance: Tolerance, what: str) -> None:
    assert isinstance(got, torch.Tensor), f"{what}: a {type(got).__name__}, not a tensor"
    assert (got.dtype, got.shape) == (want.dtype, want.shape), (
        f"{what}: {got.dtype} {tuple(got.shape)}, the reference's is "
        f"{want.dtype} {tuple(want.shape)}"
    )
    # One-byte floats (an FP8 weight) hold no value between their steps: they compare
    # bitwise (torch.testing refuses a tolerance for them).
    exact = want.dtype.is_floating_point and want.dtype.itemsize == 1
    torch.testing.assert_close(
        got.cpu(),
        want,
        rtol=0.0 if exact else tolerance.rtol,
        atol=0.0 if exact else tolerance.atol,
        msg=lambda message: f"{what} differs from the reference: {message}",
    )
