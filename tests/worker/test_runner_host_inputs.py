"""How the runner's per-step host arrays reach the device: through pinned staging memory
and a non-blocking copy where the platform pins (Platform.pin_memory), and with no copy at
all on the CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from core.worker.model_runner import ModelRunner


def runner(pin_memory: bool) -> ModelRunner:
    return ModelRunner(
        model=nn.Identity(), sampler=None, device=torch.device("cpu"), max_num_reqs=4,
        max_model_len=32, max_num_batched_tokens=16, vocab_size=8, eos_token_id=None,
        pin_memory=pin_memory,
    )  # fmt: skip


@pytest.fixture
def copies(monkeypatch) -> list[tuple[str, dict]]:
    """Every pin_memory() and to(...) on a tensor: (what, keyword arguments). A CPU-only
    torch cannot pin, so pinning returns a copy, as it does on a device build."""
    calls: list[tuple[str, dict]] = []
    real_to = torch.Tensor.to

    def pin_memory(tensor: torch.Tensor) -> torch.Tensor:
        calls.append(("pin_memory", {}))
        return tensor.clone()

    def to(tensor: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        calls.append(("to", kwargs))
        return real_to(tensor, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
    monkeypatch.setattr(torch.Tensor, "to", to)
    return calls


def test_cpu_inputs_share_the_host_arrays_memory(copies):
    positions = np.arange(6, dtype=np.int64)
    tensor = runner(pin_memory=False)._tensor(positions)
    assert tensor.data_ptr() == positions.ctypes.data  # no copy
    assert ("pin_memory", {}) not in copies


def test_pinned_inputs_are_staged_then_copied_without_blocking(copies):
    seq_lens = np.array([3, 9, 27], dtype=np.int64)
    tensor = runner(pin_memory=True)._tensor(seq_lens, torch.int32)
    assert tensor.dtype == torch.int32 and tensor.tolist() == [3, 9, 27]
    assert [name for name, _ in copies][-2:] == ["pin_memory", "to"]
    assert copies[-1][1] == {"non_blocking": True}
