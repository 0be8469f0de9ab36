"""An engine on the CPU with -O2 graphs (ReplayGraph) and a chosen attention backend, as a
process of its own: `TRITON_INTERPRET=1` must be set before triton is first imported, for
the flash backend's kernels to run here. Prints, as one JSON line, the greedy outputs and
how many FULL and piece graphs were captured and replayed."""

from __future__ import annotations

import json
import sys

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


def generate(checkpoint: str, **kwargs) -> dict:
    """Greedy outputs of PROMPTS on the selected platform, and the FULL graphs captured."""
    llm = LLM(
        checkpoint, dtype="float32", max_model_len=32, max_num_seqs=8,
        kv_cache_memory="1MiB", **kwargs,
    )  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    runner = llm.engine.core.executor.worker.runner
    full = [] if runner.graphs is None else runner.graphs.full_descriptors
    return {"tokens": [list(o.outputs[0].token_ids) for o in outputs], "full_graphs": len(full)}


def main(checkpoint: str, options: str) -> dict:
    platform = GraphPlatform()
    choice = PlatformChoice(platform.name, platform, "chosen by the test")
    processor.select_platform = lambda *args: choice
    result = generate(checkpoint, **json.loads(options))
    replays = sum(g.replays for g in platform.graphs)
    return {**result, "graphs": len(platform.graphs), "replays": replays}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])))
