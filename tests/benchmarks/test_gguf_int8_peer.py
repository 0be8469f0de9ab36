"""core-gguf-int8, core-gguf with core-cpu-kernels' int8 activations: the benchmark runs it
in a child whose environment asks for them, and holds its W2 decode to llama.cpp's."""

from __future__ import annotations

import argparse
import os
from types import SimpleNamespace

import pytest
import torch

from benchmarks import __main__ as bench
from benchmarks import offline, report, workloads


def test_core_gguf_int8_runs_w1_and_w2_in_a_child_that_asks_for_int8(
    monkeypatch, children_in_process
):
    calls = []
    monkeypatch.setattr(bench, "core_offline_in_child", lambda *a, **kw: calls.append((a, kw)))
    inputs = bench.Inputs("model.gguf", None, "w1 prompts", "w2 prompts")
    args = argparse.Namespace(workloads=("W1", "W2", "W3"), threads=2)
    bench.RUNNERS["core-gguf-int8"](args, "sizes", inputs)
    assert calls == [((2, "core-gguf-int8", ["W1", "W2"], "sizes", "w1 prompts", "model.gguf"),
                      {"environment": {"CORE_CPU_INT8_ACTIVATIONS": "1"},
                       "quantization": "gguf"})]  # fmt: skip
    assert "core-gguf-int8" in bench.parse_args(["--peers", "core-gguf-int8"]).peers


def test_the_child_runs_the_engine_with_the_environment_it_was_given(monkeypatch):
    monkeypatch.setenv("CORE_CPU_INT8_ACTIVATIONS", "0")  # restored after the test
    seen = []
    monkeypatch.setattr(offline, "core_offline", lambda *a, **kw: seen.append(
        (os.environ.get("CORE_CPU_INT8_ACTIVATIONS"), a, kw)))  # fmt: skip
    monkeypatch.setattr(offline.torch, "set_num_threads", lambda n: None)
    offline.core_offline_in_child(2, "engine", environment={"CORE_CPU_INT8_ACTIVATIONS": "1"},
                                  quantization="gguf")  # fmt: skip
    assert seen == [("1", ("engine",), {"quantization": "gguf"})]


def test_its_w2_decode_is_held_to_llama_cpps():
    results = {"W2": {"core-gguf-int8": {"decode_tokens_per_s": 150.0},
                      "llama.cpp": {"decode_tokens_per_s": 139.0}}}  # fmt: skip
    found = [t for t in report.targets(results, None) if t.name.startswith("core-gguf-int8")]
    assert [(t.name, t.met) for t in found] == [
        ("core-gguf-int8 W2 decode tok/s vs llama.cpp", True)
    ]


def _engine(quantization: str | None):
    """What `_precision` reads of an LLM."""
    model = SimpleNamespace(quantization=quantization)
    worker = SimpleNamespace(dtype=torch.float32, config=SimpleNamespace(model=model))
    executor = SimpleNamespace(worker=worker)
    return SimpleNamespace(engine=SimpleNamespace(core=SimpleNamespace(executor=executor)))


@pytest.mark.parametrize("env", ["1", "0"])
def test_the_how_column_says_when_activations_are_int8(env, monkeypatch):
    pytest.importorskip("core_cpu_kernels.candidates", reason="core-cpu-kernels not installed")
    monkeypatch.setenv("CORE_CPU_INT8_ACTIVATIONS", env)
    monkeypatch.setattr(workloads, "quant_linear_provider", lambda: "core-cpu-kernels")
    how = workloads._precision(_engine("gguf"))
    assert how.startswith("float32, gguf weights, core::quant_linear by core-cpu-kernels")
    assert how.endswith(", int8 activations") is (env == "1")
    assert workloads._precision(_engine(None)) == "float32"
