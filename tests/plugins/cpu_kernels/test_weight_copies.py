"""Kernel-layout copies of weights: one per source, fresh while no source is written, gone
with their first source, within one memory budget."""

from __future__ import annotations

import gc

import pytest
import torch

weight_copies = pytest.importorskip(
    "core_cpu_kernels.weight_copies", reason="core-cpu-kernels is not installed (optional plugin)"
)


def _tensor(shape, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


class _Maker:
    """Builds the 'copy' (sources summed, negated) and counts the builds."""

    def __init__(self, *sources: torch.Tensor):
        self.sources, self.calls = sources, 0

    def __call__(self) -> torch.Tensor:
        self.calls += 1
        return -sum(self.sources)

    def copy(self) -> torch.Tensor | None:
        return weight_copies.copy_of("test", self.sources, 4 * self.sources[0].numel(), self)


def test_a_copy_is_made_once_and_reused():
    make = _Maker(_tensor(8, 0), _tensor(8, 1))
    first = make.copy()
    assert make.copy() is first and make.calls == 1
    torch.testing.assert_close(first, -(make.sources[0] + make.sources[1]))


@pytest.mark.parametrize("written", [0, 1])
def test_writing_any_source_in_place_makes_the_copy_again(written):
    make = _Maker(_tensor(8, 0), _tensor(8, 1))
    make.copy()
    with torch.no_grad():
        make.sources[written].mul_(-2)
    again = make.copy()
    assert make.calls == 2
    torch.testing.assert_close(again, -(make.sources[0] + make.sources[1]))


def test_layouts_of_one_source_are_kept_apart():
    source = _tensor(8, 0)
    a = weight_copies.copy_of("a", (source,), 32, lambda: source * 2)
    b = weight_copies.copy_of("b", (source,), 32, lambda: source * 3)
    torch.testing.assert_close(b, a * 1.5)


def test_a_freed_source_gives_its_budget_back():
    gc.collect()  # earlier tests' sources: their copies go now, not mid-test
    before = weight_copies.copied_bytes()
    make = _Maker(_tensor((64, 32), 1))
    make.copy()
    assert weight_copies.copied_bytes() == before + 64 * 32 * 4
    del make
    gc.collect()
    assert weight_copies.copied_bytes() == before


def test_past_the_budget_no_copy_is_made(monkeypatch):
    monkeypatch.setattr(weight_copies, "max_bytes", lambda: weight_copies.copied_bytes())
    make = _Maker(_tensor(8, 0))
    assert make.copy() is None and make.calls == 0


def test_an_inference_tensor_gets_no_copy():
    # Inference tensors have no version counter, so no copy of theirs could be kept fresh.
    with torch.inference_mode():
        make = _Maker(_tensor(8, 0))
    assert make.copy() is None and make.calls == 0
