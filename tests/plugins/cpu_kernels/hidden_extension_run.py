"""One engine run of the tiny model as its own process, the C++ extension importable or
hidden: prints what served each kernel op, what became of the plugin's `kernel_ops`
entry, and the greedy outputs, as one JSON line.

    python hidden_extension_run.py CHECKPOINT hide|keep

"hide" puts None in sys.modules["core_cpu_kernels._C"] before anything is imported, so
`from core_cpu_kernels import _C` raises ImportError, as on a machine where the
extension failed to build or to load.
"""

from __future__ import annotations

import json
import sys

PROMPTS = ["w1 w2 w3", "the w4 w5 w6 w7", "w8", "w9 w3 w9 w3 w9"]


def main(checkpoint: str, hide: bool) -> dict:
    if hide:
        sys.modules["core_cpu_kernels._C"] = None
    from core import LLM, SamplingParams
    from core.ops import CORE_OPS
    from core.plugins import get_registry
    from core.plugins.groups import GENERAL

    llm = LLM(checkpoint, dtype="float32", max_model_len=64, kv_cache_memory="4MiB")
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    entry = get_registry().get(GENERAL, "kernel_ops")
    return {
        "providers": {name: CORE_OPS.provider(name, "cpu") for name in CORE_OPS.providers()},
        "kernel_ops": {"state": entry.state.value, "reason": entry.reason},
        "tokens": [list(o.outputs[0].token_ids) for o in outputs],
        "prompts": [list(o.prompt_token_ids) for o in outputs],
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2] == "hide")))
