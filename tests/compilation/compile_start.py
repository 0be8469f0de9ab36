"""One engine start at a given -O level, run as its own process (a real restart): prints
the greedy outputs of PROMPTS and what this process compiled, as one JSON line."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

from core import LLM, SamplingParams
from core.compilation.compiler import compile_counters

PROMPTS = ["a b c", "the cat sat", "x", "b a b a b a"]


def main(checkpoint: str, level: int, backend: str, cache_dir: str) -> dict:
    llm = LLM(
        checkpoint,
        optimization_level=level,
        compilation_config={"backend": backend, "cache_dir": cache_dir},
        max_model_len=64,
        kv_cache_memory="4MiB",
    )
    outputs = llm.generate(PROMPTS, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    prompts = [list(o.prompt_token_ids) for o in outputs]
    return {"tokens": tokens, "prompts": prompts, "counters": asdict(compile_counters())}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4])))
