"""-O2 end to end on a platform that captures graphs (ReplayGraph on the CPU): the steps
that fit a capture size replay graphs, and greedy output equals the eager engine's.

With torch_ref (no graph support) the compiled pieces between attention layers are
captured (PIECEWISE); with flash, whose kernels run in Triton's interpreter in a process
of their own, pure decodes replay FULL graphs, attention and its persistent metadata
included."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from graph_engine_start import GraphPlatform, generate

from core.engine import processor
from core.platforms.selection import PlatformChoice


@pytest.fixture
def graph_platform(monkeypatch) -> GraphPlatform:
    platform = GraphPlatform()
    choice = PlatformChoice(platform.name, platform, "chosen by the test")
    monkeypatch.setattr(processor, "select_platform", lambda *args: choice)
    return platform


@pytest.mark.parametrize("backend", ["eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_piecewise_graphs_replay_and_greedy_equals_eager(
    tiny_checkpoint, graph_platform, tmp_path, backend
):
    sizes = [1, 4, 16]
    config = {"backend": backend, "cache_dir": str(tmp_path), "cudagraph_capture_sizes": sizes}
    graphs = generate(str(tiny_checkpoint), compilation_config=config)["tokens"]
    # torch_ref cannot be captured whole: the compiled forward's 3 pieces (around its 2
    # attention layers) were captured at each size.
    assert len(graph_platform.graphs) == 3 * len(sizes)
    assert sum(g.replays for g in graph_platform.graphs) > 0
    eager = generate(str(tiny_checkpoint), enforce_eager=True)["tokens"]
    assert graphs == eager


START = Path(__file__).with_name("graph_engine_start.py")


def start_interpreted(checkpoint: Path, options: dict) -> dict:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    here = Path(__file__).parent
    env["PYTHONPATH"] = os.pathsep.join([str(here), str(here.parent), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, str(START), str(checkpoint), json.dumps(options)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("compilation", "full", "pieces"),
    [
        ({"backend": "eager"}, 3, 3 * 3),  # FULL_AND_PIECEWISE, vLLM's default
        pytest.param({"compile_model": False}, 3, 0, marks=pytest.mark.slow, id="FULL_DECODE_ONLY"),
    ],
)
def test_flash_decodes_replay_full_graphs_and_greedy_equals_eager(
    tiny_checkpoint, tmp_path, compilation, full, pieces
):
    config = {**compilation, "cache_dir": str(tmp_path), "cudagraph_capture_sizes": [1, 4, 16]}
    graphs = start_interpreted(
        tiny_checkpoint, {"attention_backend": "flash", "compilation_config": config}
    )
    assert (graphs["full_graphs"], graphs["graphs"]) == (full, full + pieces)
    assert graphs["replays"] > 0
    eager = generate(str(tiny_checkpoint), enforce_eager=True)["tokens"]
    assert graphs["tokens"] == eager
