"""core::linear's oneDNN candidate: it multiplies a packed copy of the weight, made once per
weight and remade when the weight is written, and falls back to torch where it can keep
none."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from core.kernel_choice import KernelChoices

ops = pytest.importorskip(
    "core_cpu_kernels.ops", reason="core-cpu-kernels is not installed (optional plugin)"
)
from core_cpu_kernels import candidates, packed_linear, weight_copies  # noqa: E402

pytestmark = pytest.mark.skipif(not packed_linear.available(), reason="torch without oneDNN")


@pytest.fixture(autouse=True)
def forced_onednn(monkeypatch):
    """Kernel choices of this test alone with oneDNN forced for core::linear (a problem's
    kernel stays chosen once looked up, so a fresh set keeps tests apart)."""
    fresh = KernelChoices()
    monkeypatch.setattr(candidates, "KERNEL_CHOICES", fresh)
    monkeypatch.setattr(ops, "KERNEL_CHOICES", fresh)
    monkeypatch.setenv("CORE_KERNEL_CHOICE", "linear=onednn")
    candidates.register()


def _tensor(shape, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _packed_calls(monkeypatch):
    calls = []
    real = packed_linear.linear

    def spy(x, packed, bias):
        calls.append(x.shape[0])
        return real(x, packed, bias)

    monkeypatch.setattr(packed_linear, "linear", spy)
    return calls


@pytest.mark.parametrize("rows", [1, 17, 64, 129, 600])
def test_the_forced_kernel_multiplies_the_packed_weight_and_matches_torch(rows, monkeypatch):
    calls = _packed_calls(monkeypatch)
    x, weight, bias = _tensor((rows, 72), 0), _tensor((100, 72), 1), _tensor(100, 2)
    got = ops.linear(x, weight, bias)
    assert calls == [rows]
    torch.testing.assert_close(got, F.linear(x, weight, bias), rtol=1e-5, atol=1e-4)


def test_a_reordered_weight_multiplies_like_the_weight():
    x, weight, bias = _tensor((5, 24), 0), _tensor((40, 24), 1), _tensor(40, 2)
    got = packed_linear.linear(x, packed_linear.reorder(weight), bias)
    torch.testing.assert_close(got, F.linear(x, weight, bias), rtol=1e-5, atol=1e-4)


def test_float32_is_always_taken():
    assert packed_linear.takes(torch.float32)


def test_an_inference_mode_weight_is_multiplied_by_torch(monkeypatch):
    # Inference tensors have no version counter, so no pack of theirs could be kept fresh.
    calls = _packed_calls(monkeypatch)
    x = _tensor((32, 24), 0)
    with torch.inference_mode():
        weight = _tensor((40, 24), 1)
        got = ops.linear(x, weight)
    assert calls == []
    torch.testing.assert_close(got, F.linear(x, weight), rtol=1e-5, atol=1e-4)


def test_a_weight_written_in_place_is_packed_again(monkeypatch):
    calls = _packed_calls(monkeypatch)
    x, weight = _tensor((32, 24), 0), _tensor((40, 24), 1)
    ops.linear(x, weight)
    with torch.no_grad():
        weight.mul_(-2)
    torch.testing.assert_close(ops.linear(x, weight), F.linear(x, weight), rtol=1e-5, atol=1e-4)
    assert calls == [32, 32]


def test_past_the_memory_budget_weights_stay_on_torch(monkeypatch):
    calls = _packed_calls(monkeypatch)
    monkeypatch.setattr(weight_copies, "max_bytes", lambda: weight_copies.copied_bytes())
    x, weight = _tensor((32, 16), 0), _tensor((8, 16), 1)
    torch.testing.assert_close(ops.linear(x, weight), F.linear(x, weight))
    assert calls == []
