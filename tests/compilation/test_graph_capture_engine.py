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
from replay_graph import ReplayGraph

from core import LLM, SamplingParams
from core.engine import processor
from core.platforms.cpu import CpuPlatform
from core.platforms.selection import PlatformChoice

PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12], [13], [14, 15, 16, 17, 18, 19, 20]]


class GraphPlatform(CpuPlatform):
    """The CPU, with -O2: its graphs are ReplayGraphs, which it keeps to count replays."""

    name = "graphs"
    supported_optimization_levels = (0, 1, 2)
    default_optimization_level = 2

    def __init__(self) -> None:
        super().__init__()
        self.graphs: list[ReplayGraph] = []

    def capture_graph(self, fn):
        self.graphs.append(ReplayGraph(fn))
        return self.graphs[-1]


@pytest.fixture
def graph_platform(monkeypatch) -> GraphPlatform:
    platform = GraphPlatform()
    choice = PlatformChoice(platform.name, platform, "chosen by the test")
    monkeypatch.setattr(processor, "select_platform", lambda *args: choice)
    return platform


def generate(checkpoint, **kwargs) -> list[list[int]]:
    llm = LLM(
        str(checkpoint), dtype="float32", max_model_len=32, max_num_seqs=8,
        kv_cache_memory="1MiB", **kwargs,
    )  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


@pytest.mark.parametrize("backend", ["eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_piecewise_graphs_replay_and_greedy_equals_eager(
    tiny_checkpoint, graph_platform, tmp_path, backend
):
    sizes = [1, 4, 16]
    config = {"backend": backend, "cache_dir": str(tmp_path), "cudagraph_capture_sizes": sizes}
    graphs = generate(tiny_checkpoint, compilation_config=config)
    # torch_ref cannot be captured whole: the compiled forward's 3 pieces (around its 2
    # attention layers) were captured at each size (one trace for 1 token, one for more).
    assert len(graph_platform.graphs) == 3 * len(sizes)
    assert sum(g.replays for g in graph_platform.graphs) > 0
    eager = generate(tiny_checkpoint, enforce_eager=True)
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
    eager = generate(tiny_checkpoint, enforce_eager=True)
    assert graphs["tokens"] == eager
