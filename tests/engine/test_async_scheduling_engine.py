"""--async-scheduling end to end: the same outputs as one step at a time.

The default model (SmolLM2, float32) serves one batch with stop strings, several
max_tokens, a JSON schema, seeded sampling and a KV cache too small for all of it
(preemption), with the worker in this process (on its own thread) and in a worker process;
and with n-gram speculation. Every request's tokens, text and finish reason must match
the engine's without async scheduling.
"""

from __future__ import annotations

import pytest

from core import LLM, SamplingParams
from core.sampling_params import StructuredOutputsParams

pytestmark = pytest.mark.slow

PROMPTS = [
    "The river wound slowly through the valley, past farms and",
    "List three colours:",
    "def merge_sorted(a, b):",
    "Scientists measured the temperature of the lake every morning",
    "Once upon a time",
    "Write the numbers from one to ten: one, two,",
    "Describe a person as JSON:",
    "The committee postponed its decision until",
]
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


def batch_params() -> list[SamplingParams]:
    greedy = dict(temperature=0.0)
    return [
        SamplingParams(**greedy, max_tokens=40, ignore_eos=True),
        SamplingParams(**greedy, max_tokens=30, stop=[","]),
        SamplingParams(**greedy, max_tokens=48, stop=["\n\n"]),
        SamplingParams(**greedy, max_tokens=1),
        SamplingParams(temperature=0.8, seed=7, max_tokens=36),
        SamplingParams(**greedy, max_tokens=40, stop=[" six"], include_stop_str_in_output=True),
        SamplingParams(
            **greedy, max_tokens=60, structured_outputs=StructuredOutputsParams(json=SCHEMA)
        ),
        SamplingParams(temperature=1.0, seed=11, max_tokens=5),
    ]


def generate(**engine: object) -> tuple[list[tuple[list[int], str, str | None]], int]:
    # 6 blocks of 16 tokens: less than the 8 requests of up to ~70 tokens need.
    llm = LLM(dtype="float32", max_model_len=96, kv_cache_memory="5MiB", **engine)
    outputs = llm.generate(PROMPTS, batch_params(), use_tqdm=False)
    preemptions = llm.engine.core.scheduler.num_preemptions
    llm.engine.shutdown()
    return [
        (list(o.outputs[0].token_ids), o.outputs[0].text, o.outputs[0].finish_reason)
        for o in outputs
    ], preemptions


@pytest.fixture(scope="module")
def one_step_at_a_time():
    outputs, preemptions = generate(async_scheduling=False)
    assert preemptions > 0
    assert {reason for _, _, reason in outputs} == {"stop", "length"}
    return outputs


@pytest.mark.parametrize("backend", ["uni", "mp"])
def test_async_scheduling_gives_the_same_outputs(one_step_at_a_time, backend):
    outputs, preemptions = generate(async_scheduling=True, distributed_executor_backend=backend)
    assert preemptions > 0
    assert outputs == one_step_at_a_time


def test_with_ngram_speculation_too():
    speculative = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
    outputs = {
        flag: generate(async_scheduling=flag, speculative_config=speculative)[0]
        for flag in (False, True)
    }
    assert outputs[True] == outputs[False]
