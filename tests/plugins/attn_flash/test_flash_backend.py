"""The flash backend's class: registration, capabilities and the reasons it refuses."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points

import pytest
import torch

pytest.importorskip("core_attn_flash", reason="core-attn-flash is not installed (optional plugin)")

from core_attn_flash.backend import FlashAttentionBackend, FlashAttentionImpl  # noqa: E402

from core.attention.interface import AttentionRequirements, GraphSupport  # noqa: E402

SERVABLE = AttentionRequirements(torch.float16, 128, 16)


def test_registered_as_flash_attention_backend():
    (entry,) = [e for e in entry_points(group="core.attention_backends") if e.name == "flash"]
    assert entry.load() is FlashAttentionBackend
    assert FlashAttentionBackend.name == "flash"


def test_declares_full_graph_support_and_the_reference_kv_layout():
    assert FlashAttentionBackend.graph_support is GraphSupport.ALWAYS
    assert FlashAttentionBackend.get_kv_cache_shape(10, 16, 2, 64) == (10, 2, 16, 2, 64)


def test_serves_on_a_gpu(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert FlashAttentionBackend.supports_combination(SERVABLE) is None


def test_serves_without_a_gpu_under_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert FlashAttentionBackend.supports_combination(SERVABLE) is None


def test_refuses_without_a_gpu_naming_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    reason = FlashAttentionBackend.supports_combination(SERVABLE)
    assert "no CUDA or ROCm GPU" in reason and "TRITON_INTERPRET" in reason


def test_refuses_without_triton(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # makes `import triton` fail
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert "triton is not importable" in FlashAttentionBackend.supports_combination(SERVABLE)


@pytest.mark.parametrize(
    ("req", "words"),
    [
        (AttentionRequirements(torch.float64, 128, 16), "dtype torch.float64"),
        (AttentionRequirements(torch.float16, 72, 16), "head size 72"),
        (AttentionRequirements(torch.float16, 128, 128), "block size 128"),
        (AttentionRequirements(torch.float16, 128, 16, "fp8_e4m3"), "KV-cache dtype"),
    ],
)
def test_refuses_undeclared_requirements_before_looking_for_a_device(monkeypatch, req, words):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert words in FlashAttentionBackend.supports_combination(req)


def test_backend_module_loads_and_answers_without_triton():
    # The selector loads the class on any machine: the kernels (and triton) load at the
    # first forward only.
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import torch\n"
        "from core.attention.interface import AttentionRequirements\n"
        "from core_attn_flash.backend import FlashAttentionBackend\n"
        "req = AttentionRequirements(torch.float16, 128, 16)\n"
        "print(FlashAttentionBackend.supports_combination(req))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "triton is not importable" in result.stdout


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"split_kv_min_seq_len": 0}, "split_kv_min_seq_len must be at least 1"),
        ({"sliding_window": 0}, "sliding_window must be at least 1"),
    ],
)
def test_impl_rejects_bad_settings_naming_them(kwargs, message):
    args = {"num_heads": 4, "head_size": 64, "scale": 0.125, "num_kv_heads": 2} | kwargs
    with pytest.raises(ValueError, match=message):
        FlashAttentionImpl(**args)


def test_impl_rejects_heads_not_grouped_evenly():
    with pytest.raises(ValueError, match="num_heads 6 is not a multiple of num_kv_heads"):
        FlashAttentionImpl(6, 64, 0.125, 4)
