"""Declaring kernel ops and registering device kernels, on a throw-away namespace.

Each test gets its own torch.library namespace, so no registration outlives it or reaches
core's own ops.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import pytest
import torch

from core.ops import Conformance, KernelOp, OpRegistry, OpSample, Tolerance


def _scale_reference(x: torch.Tensor, factor: float) -> torch.Tensor:
    return x * factor


def _scale_fake(x: torch.Tensor, factor: float) -> torch.Tensor:
    return torch.empty_like(x)


def _toy_kernel(x: torch.Tensor, factor: float) -> torch.Tensor:
    return x * factor + 100  # distinguishable from the reference


def _scale_samples(dtype: torch.dtype, device: torch.device) -> list[OpSample]:
    return [OpSample("two values", (torch.tensor([1.0, -2.0], dtype=dtype, device=device), 3.0))]


CONFORMANCE = Conformance(_scale_samples, {torch.float32: Tolerance(rtol=1e-6, atol=0.0)})


@dataclass
class Toy:
    """A throw-away namespace with one declared op, `scale(x, factor) = x * factor`."""

    registry: OpRegistry
    op: KernelOp

    def dispatch(self, *args):
        """The op through torch's dispatcher."""
        return getattr(torch.ops, self.registry.namespace).scale(*args)


def _namespace() -> OpRegistry:
    return OpRegistry(f"core_test_{uuid.uuid4().hex[:12]}")


@pytest.fixture
def toy() -> Toy:
    registry = _namespace()
    schema = "scale(Tensor x, float factor) -> Tensor"
    return Toy(registry, registry.declare(schema, _scale_reference, _scale_fake, CONFORMANCE))


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


def test_a_declared_op_carries_its_samples_and_tolerances(toy):
    (sample,) = toy.op.conformance.samples(torch.float64, torch.device("cpu"))
    assert sample.name == "two values" and sample.args[0].dtype == torch.float64
    assert toy.op.conformance.tolerances == {torch.float32: Tolerance(rtol=1e-6, atol=0.0)}


def test_conformance_without_a_dtype_to_check_is_refused():
    with pytest.raises(ValueError, match="tolerances: name at least one dtype"):
        Conformance(_scale_samples, {})


def test_registrations_of_names_what_a_registration_callable_serves_again_included(toy):
    def register():
        toy.registry.register_impl("scale", "cpu", _toy_kernel, provider="toy-kernels")

    assert toy.registry.registrations_of(register) == [(toy.op, "cpu")]
    assert toy.registry.registrations_of(register) == [(toy.op, "cpu")]  # re-entrant: a no-op
    assert toy.registry.registrations_of(lambda: None) == []


def test_registrations_of_stops_recording_when_the_callable_raises(toy):
    def broken():
        raise ImportError("libtoy.so not found")

    with pytest.raises(ImportError, match="libtoy.so"):
        toy.registry.registrations_of(broken)
    toy.registry.register_impl("scale", "cpu", _toy_kernel, provider="toy-kernels")
    assert toy.registry.registrations_of(lambda: None) == []


def _add_one_reference(x: torch.Tensor) -> None:
    x.add_(1)


def _add_one_kernel(x: torch.Tensor) -> None:
    x.add_(100)


def test_an_op_that_writes_into_its_argument_works_by_either_route_and_under_compilation():
    registry = _namespace()
    op = registry.declare("add_one(Tensor(a!) x) -> ()", _add_one_reference, lambda x: None, None)
    buffer = torch.zeros(2, 3)
    assert op(buffer[:, 1]) is None
    getattr(torch.ops, registry.namespace).add_one(buffer[:, 2])
    assert torch.equal(buffer, torch.tensor([[0.0, 1.0, 1.0]] * 2))

    registry.register_impl("add_one", "cpu", _add_one_kernel, provider="toy-kernels")

    def step(x: torch.Tensor) -> torch.Tensor:
        view = x[:, :1]  # a view of a graph input, written in place
        op(view)
        return x * 2

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(torch.zeros(2, 2)), torch.tensor([[200.0, 0.0]] * 2))
