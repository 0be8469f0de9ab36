"""-O1 on the CPU: greedy parity with -O0, one trace for every batch size, and a second
start that generates no code (inductor's on-disk cache)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import compile_start
import pytest
import torch
from determinism import assert_greedy_equivalent

from core.compilation.compiler import compile_counters
from core.testing.tiny_checkpoint import reference_model

START = Path(__file__).with_name("compile_start.py")


def start(checkpoint: Path, level: int, backend: str, cache_dir: Path) -> dict:
    """A fresh process: nothing compiled in memory, only what the cache dir holds."""
    done = subprocess.run(
        [sys.executable, str(START), str(checkpoint), str(level), backend, str(cache_dir)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def assert_matches_eager(compiled: dict, eager: dict) -> None:
    reference = reference_model()

    def logits(tokens: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return reference(torch.tensor([tokens])).logits[0, -1]

    for prompt, ours, theirs in zip(
        compiled["prompts"], compiled["tokens"], eager["tokens"], strict=True
    ):
        assert_greedy_equivalent(ours, theirs, logits, prompt, label=f"prompt {prompt}")


def test_traced_once_for_all_batch_sizes_and_greedy_equals_eager(
    tiny_checkpoint, tmp_path, monkeypatch
):
    # compile_model points inductor at the cache dir for the process: undone after.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    before = compile_counters().graphs
    # Dynamo's "eager" backend: the same trace as inductor's, without code generation.
    compiled = compile_start.main(str(tiny_checkpoint), 1, "eager", str(tmp_path))
    traced = compile_counters().graphs - before
    eager = compile_start.main(str(tiny_checkpoint), 0, "eager", str(tmp_path))
    assert_matches_eager(compiled, eager)
    # One graph for every size, traced at startup: the steps (prefills of 4 prompts, then
    # decode batches shrinking to one row) traced nothing more.
    assert traced == 1
    assert compile_counters().graphs - before == 1


@pytest.mark.slow
def test_inductor_greedy_equals_eager_and_a_restart_hits_the_compile_cache(
    tiny_checkpoint, tmp_path
):
    cold = start(tiny_checkpoint, 1, "inductor", tmp_path / "cache")
    warm = start(tiny_checkpoint, 1, "inductor", tmp_path / "cache")
    eager = start(tiny_checkpoint, 0, "inductor", tmp_path / "unused")
    assert cold["counters"]["cache_misses"] == cold["counters"]["graphs"] > 0
    assert warm["counters"]["cache_misses"] == 0
    assert warm["counters"]["cache_hits"] == cold["counters"]["graphs"]
    assert_matches_eager(cold, eager)
    assert warm["tokens"] == cold["tokens"]
