"""Declaring kernel ops and registering device kernels, on a throw-away namespace.

Each test gets its own torch.library namespace, so no registration outlives it or reaches
core's own ops.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import pytest
import torch

from core.ops import KernelOp, OpRegistry


def _scale_reference(x: torch.Tensor, factor: float) -> torch.Tensor:
    return x * factor


def _scale_fake(x: torch.Tensor, factor: float) -> torch.Tensor:
    return torch.empty_like(x)


def _toy_kernel(x: torch.Tensor, factor: float) -> torch.Tensor:
    return x * factor + 100  # distinguishable from the reference


@dataclass
class Toy:
    """A throw-away namespace with one declared op, `scale(x, factor) = x * factor`."""

    registry: OpRegistry
    op: KernelOp

    def dispatch(self, *args):
        """The op through torch's dispatcher."""
        return getattr(torch.ops, self.registry.namespace).scale(*args)


@pytest.fixture
def toy() -> Toy:
    registry = OpRegistry(f"core_test_{uuid.uuid4().hex[:12]}")
    schema = "scale(Tensor x, float factor) -> Tensor"
    return Toy(registry, registry.declare(schema, _scale_reference, _scale_fake))


def test_a_declared_op_runs_its_reference_by_either_route(toy):
    x = torch.tensor([1.0, -2.0])
    assert torch.equal(toy.op(x, 3.0), torch.tensor([3.0, -6.0]))
    assert torch.equal(toy.dispatch(x, 3.0), torch.tensor([3.0, -6.0]))
    assert toy.registry.providers() == {"scale": {}}


def test_a_registered_kernel_serves_its_device_type_by_either_route(toy):
    toy.registry.register_impl("scale", "cpu", _toy_kernel, provider="toy-kernels")
    x = torch.tensor([1.0, -2.0])
    assert torch.equal(toy.op(x, 3.0), torch.tensor([103.0, 94.0]))
    assert torch.equal(toy.dispatch(x, 3.0), torch.tensor([103.0, 94.0]))
    assert toy.registry.providers() == {"scale": {"cpu": "toy-kernels"}}
    assert toy.registry.provider("scale", "cpu") == "toy-kernels"
    assert toy.registry.provider("scale", "cuda") is None  # the reference serves it


def test_a_kernel_for_another_device_type_leaves_cpu_on_the_reference(toy):
    toy.registry.register_impl("scale", "cuda", _toy_kernel, provider="toy-kernels")
    x = torch.tensor([1.0])
    assert torch.equal(toy.op(x, 2.0), torch.tensor([2.0]))
    assert torch.equal(toy.dispatch(x, 2.0), torch.tensor([2.0]))
    assert toy.registry.providers() == {"scale": {"cuda": "toy-kernels"}}


def test_the_same_registration_twice_is_a_no_op(toy):
    toy.registry.register_impl("scale", "cpu", _toy_kernel, provider="toy-kernels")
    toy.registry.register_impl("scale", "cpu", _toy_kernel, provider="toy-kernels")
    assert torch.equal(toy.dispatch(torch.tensor([0.0]), 1.0), torch.tensor([100.0]))


def test_another_registration_for_a_served_device_type_names_the_current_provider(toy):
    toy.registry.register_impl("scale", "cpu", _toy_kernel, provider="toy-kernels")
    with pytest.raises(ValueError, match="already served by toy-kernels; rival cannot"):
        toy.registry.register_impl("scale", "cpu", _scale_reference, provider="rival")
    with pytest.raises(ValueError, match="already served by toy-kernels"):
        toy.registry.register_impl("scale", "cpu", _scale_reference, provider="toy-kernels")
    assert toy.registry.providers() == {"scale": {"cpu": "toy-kernels"}}


def test_an_undeclared_op_is_refused_with_the_declared_names(toy):
    with pytest.raises(ValueError, match=r"op_name 'shift' is not a declared .* declared: scale"):
        toy.registry.register_impl("shift", "cpu", _toy_kernel, provider="toy-kernels")


def test_an_unknown_device_type_is_refused(toy):
    with pytest.raises(ValueError, match="device_type 'warp-drive'"):
        toy.registry.register_impl("scale", "warp-drive", _toy_kernel, provider="toy-kernels")
    assert toy.registry.providers() == {"scale": {}}


def test_a_kernel_that_is_not_callable_is_refused(toy):
    with pytest.raises(TypeError, match="toy-kernels .* is not callable"):
        toy.registry.register_impl("scale", "cpu", "not a function", provider="toy-kernels")


def test_compilation_traces_the_op_itself_and_runs_the_registered_kernel(toy):
    toy.registry.register_impl("scale", "cpu", _toy_kernel, provider="toy-kernels")
    op, graphs = toy.op, []

    def capture(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    compiled = torch.compile(lambda x: op(x, 2.0) * 2, backend=capture, fullgraph=True)
    assert torch.equal(compiled(torch.tensor([1.0])), torch.tensor([204.0]))
    targets = [node.target for node in graphs[0].graph.nodes]
    assert getattr(torch.ops, toy.registry.namespace).scale.default in targets
