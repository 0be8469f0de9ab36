"""Kernel ops: torch.library custom ops with a reference, a fake, and per-device kernels.

Core declares each op once — its schema, a pure-PyTorch reference implementation (the
semantics every other kernel must reproduce) and a fake that computes output shapes and
dtypes for tracing. Plugins then register faster kernels for a device type through
`register_impl`, and the registry remembers which provider serves each (op, device type)
so `core info` can name it.

Each kernel op also carries sample inputs and a tolerance per dtype (`core.ops.samples`):
the conformance kit checks every kernel a plugin registers against the reference over them.
`registrations_of` tells which kernels one plugin's registration callable serves.

Two routes reach the same kernels. `torch.ops.<namespace>.<name>` goes through the
dispatcher (the registered kernel for the tensors' device, else the reference), which is
what tracing and compilation see. Calling the `KernelOp` itself in eager mode reads the
same table in Python and calls the kernel directly: the dispatcher's Python-kernel
round trip costs several microseconds per call, as much as a whole small norm.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from core.ops.samples import Conformance

REFERENCE = "reference"
"""The provider name `providers` implies for a device type nobody registered a kernel for."""

# The reference serves every device type the dispatcher knows; device kernels override it.
_REFERENCE_KEY = "CompositeExplicitAutograd"


@dataclass
class KernelOp:
    """One declared op: its reference, conformance samples and tolerances, and the kernels
    registered per device type."""

    name: str
    qualname: str  # "namespace::name"
    reference: Callable[..., Any]
    conformance: Conformance | None  # None: a dispatch seam, not a kernel op (see declare)
    kernels: dict[str, Callable[..., Any]] = field(default_factory=dict)  # by device type
    providers: dict[str, str] = field(default_factory=dict)  # by device type

    @property
    def overload(self) -> torch._ops.OpOverload:
        """The dispatcher's entry for this op (`torch.ops.namespace.name.default`)."""
        namespace, name = self.qualname.split("::")
        return getattr(getattr(torch.ops, namespace), name).default

    def __call__(self, *args: Any) -> Any:
        """Run the kernel for the first argument's device type, else the reference.

        While torch.compile traces, the call goes through the dispatcher instead, so the
        graph holds the op itself (shaped by its fake), not the Python inside a kernel.
        """
        if torch.compiler.is_compiling():
            return self.overload(*args)
        first = args[0]
        # `.device` builds a torch.device on every call (~2 µs measured inside a model's
        # loop, a tenth of a small norm); a flag answers for the CPU, the common case.
        device_type = "cpu" if first.is_cpu else first.device.type
        return self.kernels.get(device_type, self.reference)(*args)


class OpRegistry:
    """The kernel ops of one torch.library namespace (core's is `CORE_OPS`, "core")."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self._library = torch.library.Library(namespace, "DEF")
        self._ops: dict[str, KernelOp] = {}
        self._recorded: dict[tuple[str, str], KernelOp] | None = None  # by (op, device type)

    def declare(
        self,
        schema: str,
        reference: Callable[..., Any],
        fake: Callable[..., Any],
        conformance: Conformance | None,
    ) -> KernelOp:
        """Define `namespace::name` from a schema such as "name(Tensor x) -> Tensor".

        `reference` serves every device type until a kernel is registered for it; `fake`
        computes the outputs' metadata from fake inputs for tracing. Outputs must be new
        tensors, never views of the inputs. An op that writes into arguments marks them in
        the schema ("name(Tensor(a!) x) -> ()"), returns nothing, and its fake returns None.

        `conformance` holds the samples and per-dtype tolerances the conformance kit checks
        every registered kernel against (see `core.ops.samples`). None is for an op that is
        a dispatch seam rather than a kernel (core::unified_attention: the attention
        backend does its work); the kit refuses a kernel registered for such an op.
        """
        name = schema.split("(", 1)[0].strip()
        qualname = f"{self.namespace}::{name}"
        self._library.define(schema)
        self._library.impl(name, reference, _REFERENCE_KEY)
        torch.library.register_fake(qualname, fake, lib=self._library)
        op = KernelOp(name, qualname, reference, conformance)
        self._ops[name] = op
        return op

    def register_impl(
        self, op_name: str, device_type: str, fn: Callable[..., Any], provider: str
    ) -> None:
        """Serve `op_name` on `device_type` tensors with `fn`, recorded as `provider`'s.

        `fn` takes the op's arguments and must equal the reference (to the precision its
        dtype allows) on every input the op accepts. One provider per (op, device type):
        the same provider registering the same function again is a no-op, so a
        `core.general` plugin may run twice; anything else raises ValueError naming the
        provider already serving it. An undeclared op or unknown device type also raises
        ValueError.
        """
        op = self.get(op_name)
        current = op.providers.get(device_type)
        if current is not None:
            if current == provider and op.kernels[device_type] is fn:
                self._record(op, device_type)
                return
            raise ValueError(
                f"{op.qualname} on {device_type!r} is already served by {current}; "
                f"{provider} cannot register another kernel for it"
            )
        if not callable(fn):
            raise TypeError(f"the kernel {provider} registers for {op.qualname} is not callable")
        try:
            torch.library.impl(op.qualname, device_type, fn, lib=self._library)
        except RuntimeError as exc:
            raise ValueError(f"device_type {device_type!r}: {exc}") from exc
        op.kernels[device_type] = fn
        op.providers[device_type] = provider
        self._record(op, device_type)

    def registrations_of(self, register: Callable[[], None]) -> list[tuple[KernelOp, str]]:
        """Call `register` (a plugin's re-entrant registration callable, e.g. its
        `core.general` entry point) and return the (op, device type) pairs it served,
        those it had registered before included: what the plugin provides, for the
        conformance kit to check. Exceptions from `register` propagate."""
        self._recorded = {}
        try:
            register()
            return [(op, device_type) for (_, device_type), op in self._recorded.items()]
        finally:
            self._recorded = None

    def providers(self) -> dict[str, dict[str, str]]:
        """Op name -> {device type: provider} of the registered kernels.

        A device type absent from an op's dict is served by the reference (`REFERENCE`).
        """
        return {name: dict(op.providers) for name, op in self._ops.items()}

    def provider(self, op_name: str, device_type: str) -> str | None:
        """Who serves `op_name` on `device_type` tensors; None when the reference does."""
        return self.get(op_name).providers.get(device_type)

    def _record(self, op: KernelOp, device_type: str) -> None:
        if self._recorded is not None:
            self._recorded[op.name, device_type] = op

    def get(self, op_name: str) -> KernelOp:
        """The declared op `op_name`; ValueError naming the declared ones otherwise."""
        op = self._ops.get(op_name)
        if op is None:
            declared = ", ".join(sorted(self._ops)) or "none"
            raise ValueError(
                f"op_name {op_name!r} is not a declared {self.namespace} op; declared: {declared}"
            )
        return op


CORE_OPS = OpRegistry("core")
"""Core's kernel ops (namespace "core"); `core.ops` declares them on import."""
