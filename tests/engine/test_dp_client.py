"""DPClient's routing: fewest unfinished requests first, then the least KV in use; each
batch of outputs keeps its own engine's stats and index."""

from __future__ import annotations

import asyncio

from core.engine.dp_client import DPClient
from core.engine.protocol import EngineCoreOutput, EngineCoreOutputs, FinishReason, SchedulerStats


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


class Engine:
    """An engine core client that answers the same outputs whenever asked."""

    def __init__(self, outputs: EngineCoreOutputs) -> None:
        self.outputs = outputs

    async def get_outputs(self) -> EngineCoreOutputs:
        return self.outputs


def answering(loads: list[int], outputs: list[EngineCoreOutputs]) -> DPClient:
    client = routing(loads, [0.0] * len(loads))
    client.engines = [Engine(o) for o in outputs]
    client._owner, client._waiting, client.dead_reason = {}, {}, None
    return client


def test_each_batch_keeps_its_own_engines_stats_and_index() -> None:
    client = answering(
        [0, 0],
        [
            EngineCoreOutputs(scheduler_stats=stats(1, 0.5)),
            EngineCoreOutputs(scheduler_stats=stats(3, 0.25), engine_index=1),
        ],
    )

    async def two_batches() -> list[EngineCoreOutputs]:
        return [await client.get_outputs(), await client.get_outputs()]

    got = asyncio.run(two_batches())
    assert sorted((o.engine_index, o.scheduler_stats.num_running) for o in got) == [(0, 1), (1, 3)]
    assert [s.num_running for s in client._stats] == [1, 3]


def test_a_finished_request_stops_counting_against_its_engine_even_engine_0() -> None:
    done = EngineCoreOutput(request_id="r0", new_token_ids=[1], finish_reason=FinishReason.STOP)
    client = answering([1, 0], [EngineCoreOutputs(outputs=[done])])
    client._owner = {"r0": 0}
    asyncio.run(client.get_outputs())
    assert client._load == [0, 0] and client._owner == {}


class WakeableEngine(Engine):
    """An engine core client that records the waves it is told to join and answers only
    when `answers` (else its get_outputs waits for good)."""

    def __init__(self, outputs: EngineCoreOutputs, answers: bool) -> None:
        super().__init__(outputs)
        self.answers = answers
        self.woken: list[int] = []

    async def get_outputs(self) -> EngineCoreOutputs:
        if not self.answers:
            await asyncio.Event().wait()
        return self.outputs

    async def start_wave(self, wave: int) -> None:
        self.woken.append(wave)


def test_an_engine_starting_a_wave_wakes_every_other_engine_into_it() -> None:
    client = answering([0, 0, 0], [EngineCoreOutputs()] * 3)
    client.engines = [
        WakeableEngine(EngineCoreOutputs(start_wave=4, engine_index=i), answers=i == 1)
        for i in range(3)
    ]

    async def one_batch() -> EngineCoreOutputs:
        outputs = await client.get_outputs()
        for task in client._waiting.values():  # the other engines' waits
            task.cancel()
        return outputs

    assert asyncio.run(one_batch()).engine_index == 1
    assert [engine.woken for engine in client.engines] == [[4], [], [4]]
