"""DPClient's routing: fewest unfinished requests first, then the least KV in use; stats of
all engines combined into one snapshot."""

from __future__ import annotations

from core.engine.dp_client import DPClient, _combined
from core.engine.protocol import SchedulerStats, SpecDecodingStats


def stats(running: int, kv: float, **extra) -> SchedulerStats:
    return SchedulerStats(
        num_running=running, num_waiting=1, kv_cache_usage=kv, prefix_cache_queries=10,
        prefix_cache_hits=4, num_preemptions=1, **extra,
    )  # fmt: skip


def routing(loads: list[int], kv: list[float]) -> DPClient:
    client = DPClient.__new__(DPClient)  # routing only: no engine processes
    client.engines = [None] * len(loads)
    client._load = list(loads)
    client._stats = [stats(0, usage) for usage in kv]
    return client


def test_a_request_goes_to_the_engine_with_the_fewest_unfinished_requests() -> None:
    assert routing([3, 1, 2], [0.0, 0.9, 0.0]).choose() == 1


def test_ties_go_to_the_engine_with_less_kv_cache_in_use() -> None:
    assert routing([2, 2, 5], [0.7, 0.2, 0.0]).choose() == 1


def test_stats_of_all_engines_are_summed_and_kv_usage_averaged() -> None:
    spec = [
        SpecDecodingStats(num_drafts=2, num_draft_tokens=6, num_accepted_tokens=3,
                          num_accepted_tokens_per_pos=[2, 1, 0]),
        SpecDecodingStats(num_drafts=1, num_draft_tokens=3, num_accepted_tokens=3,
                          num_accepted_tokens_per_pos=[1, 1, 1]),
    ]  # fmt: skip
    combined = _combined(
        [
            stats(2, 0.5, spec_decoding=spec[0], running_lora_adapters={"a": 1}),
            stats(3, 0.25, spec_decoding=spec[1], running_lora_adapters={"a": 2, "b": 1}),
        ]
    )
    assert (combined.num_running, combined.num_waiting, combined.kv_cache_usage) == (5, 2, 0.375)
    assert (combined.prefix_cache_queries, combined.prefix_cache_hits) == (20, 8)
    assert combined.spec_decoding.num_accepted_tokens_per_pos == [3, 2, 1]
    assert combined.spec_decoding.num_draft_tokens == 9
    assert combined.running_lora_adapters == {"a": 3, "b": 1}


def test_a_finished_request_stops_counting_against_its_engine_even_engine_0() -> None:
    import asyncio

    from core.engine.protocol import EngineCoreOutput, EngineCoreOutputs, FinishReason

    class Engine:
        def __init__(self, outputs: EngineCoreOutputs) -> None:
            self.outputs = outputs

        async def get_outputs(self) -> EngineCoreOutputs:
            return self.outputs

    done = EngineCoreOutput(request_id="r0", new_token_ids=[1], finish_reason=FinishReason.STOP)
    client = routing([1, 0], [0.0, 0.0])
    client.engines = [Engine(EngineCoreOutputs(outputs=[done]))]
    client._owner = {"r0": 0}
    client._waiting = {}
    client.dead_reason = None
    asyncio.run(client.get_outputs())
    assert client._load == [0, 0] and client._owner == {}
