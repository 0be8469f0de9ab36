"""Driving one request through an in-process engine with a KV connector, as the
kv_connectors tests do: to its end, with kv_transfer_params, and the block pool's count."""

from __future__ import annotations

from core.engine.llm_engine import LLMEngine
from core.sampling_params import SamplingParams


def run_request(
    engine: LLMEngine,
    req_id: str,
    prompt: list[int],
    max_tokens: int,
    kv_transfer_params: dict | None = None,
) -> tuple[list[int], int, dict | None]:
    """Greedy to its end: (token ids, prompt tokens not computed, kv_transfer_params)."""
    extra = None if kv_transfer_params is None else {"kv_transfer_params": kv_transfer_params}
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                            extra_args=extra)  # fmt: skip
    engine.add_request(req_id, prompt, params)
    while True:
        for output in engine.step():
            if output.finished:
                return (
                    output.outputs[0].token_ids,
                    output.num_cached_tokens,
                    output.kv_transfer_params,
                )


def free_blocks(engine: LLMEngine) -> int:
    return engine.core.scheduler.kv.coordinator.block_pools[0].get_num_free_blocks()
