"""Where a decode step's time goes at 1, 4 and 32 streams: scheduling, input preparation,
the model's forward, logits and sampling, and the scheduler's bookkeeping of the outputs.

Each phase is timed by wrapping the engine's own methods on one engine instance (nothing
is changed for other engines); steps are measured once every request is decoding.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from core.entrypoints.bench.datasets import synthetic_prompts
from core.entrypoints.llm import LLM
from core.sampling_params import SamplingParams

STREAMS, INPUT_LEN, NUM_STEPS = (1, 4, 32), 128, 30

# phase -> (object path from the EngineCore, method names)
PHASES: dict[str, tuple[str, tuple[str, ...]]] = {
    "schedule": ("scheduler", ("schedule",)),
    "inputs": ("runner", ("_update_states", "_step_inputs", "_attention_metadata")),
    "forward": ("model", ("forward",)),
    "sample": ("runner", ("_sample",)),
    "logits": ("model", ("compute_logits",)),
    "update": ("scheduler", ("update_from_output",)),
}


def measure(llm: LLM, seed: int = 7) -> dict[str, Any]:
    """Under "runs", one run per STREAMS: milliseconds per decode step by phase with that
    many requests decoding (`decode_step_phases`), "streams", the share of the step spent
    scheduling and preparing inputs ("scheduling_and_inputs_share") and the share outside
    the model's forward ("outside_forward_share": logits, sampling and the engine's own
    work)."""
    prompts = synthetic_prompts(llm.engine.tokenizer, max(STREAMS), INPUT_LEN, seed=seed)
    return {"runs": [shares(n, decode_step_phases(llm, prompts[:n], NUM_STEPS)) for n in STREAMS]}


def shares(streams: int, per_step: dict[str, float]) -> dict[str, float]:
    """`per_step` with its stream count and the shares `measure` names."""
    step = per_step["step_ms"]
    engine_work = per_step["schedule_ms"] + per_step["inputs_ms"] + per_step["update_ms"]
    return {
        "streams": streams,
        **per_step,
        "scheduling_and_inputs_share": engine_work / step,
        "outside_forward_share": (step - per_step["forward_ms"]) / step,
    }


Instrument = Callable[[Any, dict[str, float]], Callable[[], None]]


def decode_step_phases(
    llm: LLM, prompts: list[list[int]], num_steps: int, more: Instrument | None = None
) -> dict[str, float]:
    """ "<phase>_ms" per decode step over `num_steps` steps once every one of `prompts`
    decodes, and "step_ms"; `more(engine, totals)` wraps further methods for the time (it
    returns what undoes its wrapping)."""
    engine = llm.engine
    params = SamplingParams(max_tokens=num_steps + 8, temperature=0.0, ignore_eos=True)
    for prompt in prompts:
        engine.add_request(engine.new_request_id(), prompt, params)
    while num_prefilling(engine) > 0:
        engine.step()
    totals: dict[str, float] = defaultdict(float)
    restore = instrument(engine, totals)
    restore_more = more(engine, totals) if more is not None else (lambda: None)
    try:
        start = time.perf_counter()
        for _ in range(num_steps):
            engine.step()
        totals["step"] = time.perf_counter() - start
    finally:
        restore_more()
        restore()
    while engine.has_unfinished_requests():
        engine.step()
    return {f"{k}_ms": v * 1000 / num_steps for k, v in totals.items()}


def num_prefilling(engine: Any) -> int:
    scheduler = engine.core.scheduler
    return len(scheduler.waiting) + sum(
        r.num_computed_tokens < r.num_prompt_tokens for r in scheduler.running
    )


def instrument(engine: Any, totals: dict[str, float]) -> Callable[[], None]:
    runner = engine.core.executor.worker.runner
    owners = {"scheduler": engine.core.scheduler, "runner": runner, "model": runner.model}
    wrapped: list[tuple[Any, str]] = []
    for phase, (owner_name, methods) in PHASES.items():
        owner = owners[owner_name]
        for name in methods:
            setattr(owner, name, timed_phase(getattr(owner, name), phase, totals))
            wrapped.append((owner, name))

    def restore() -> None:
        for owner, name in wrapped:
            delattr(owner, name)  # the class's method shows through again

    return restore


def timed_phase(fn: Callable[..., Any], phase: str, totals: dict[str, float]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[phase] += time.perf_counter() - start

    return timed
