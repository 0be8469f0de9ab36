"""SchedulerStats.num_waiting_deferred: of the waiting requests, those a transient
constraint holds (an adapter beyond max_loras, a grammar compiling, external KV loading)
rather than the lack of room; the rest wait for capacity."""

from __future__ import annotations

import torch
from test_scheduler import SlowGrammars

from core.config import EngineConfig, LoRAConfig, SchedulerConfig
from core.kv_cache.grouping import kv_cache_config_for_blocks
from core.kv_cache.kv_cache_manager import KVCacheManager
from core.kv_cache.spec import FullAttentionSpec
from core.lora.request import LoRARequest
from core.request import Request, RequestStatus
from core.sampling_params import SamplingParams, StructuredOutputsParams
from core.scheduler.scheduler import Scheduler
from core.worker.contract import ModelRunnerOutput

MAX_LEN = 64
ADAPTERS = {name: LoRARequest(name, i, f"/adapters/{name}") for i, name in enumerate("ab", 1)}


def make_scheduler() -> Scheduler:
    spec = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=2, dtype=torch.float32)
    kv = KVCacheManager(kv_cache_config_for_blocks({"layer.0": spec}, 64), MAX_LEN)
    config = EngineConfig(lora=LoRAConfig(max_loras=1), scheduler=SchedulerConfig(max_num_seqs=2))
    scheduler = Scheduler(config, kv, MAX_LEN)
    scheduler.grammars = SlowGrammars()
    return scheduler


def add(scheduler: Scheduler, req_id: str, adapter: str | None = None, grammar=False) -> None:
    constraint = StructuredOutputsParams(json_object=True) if grammar else None
    params = SamplingParams(temperature=0.0, max_tokens=8, structured_outputs=constraint)
    scheduler.add_request(
        Request(req_id, [1, 2, 3], params, eos_token_id=None, arrival_time=0.0,
                lora_request=adapter and ADAPTERS[adapter], max_model_len=MAX_LEN)
    )  # fmt: skip


def test_deferred_waiting_requests_are_those_room_alone_would_not_admit() -> None:
    scheduler = make_scheduler()
    add(scheduler, "a1", "a")
    add(scheduler, "b1", "b")  # its adapter needs a second slot: max_loras is 1
    add(scheduler, "compiling", grammar=True)
    add(scheduler, "a2", "a")  # the batch is full after it: max_num_seqs is 2
    add(scheduler, "base")
    add(scheduler, "compiled", grammar=True)
    add(scheduler, "loading")
    scheduler.grammars.ready.add("compiled")
    so = scheduler.schedule()
    assert sorted(so.num_scheduled_tokens) == ["a1", "a2"]
    scheduler.update_from_output(
        so, ModelRunnerOutput(req_ids=["a1", "a2"], sampled_token_ids=[[7], [7]])
    )
    scheduler.requests["loading"].status = RequestStatus.WAITING_FOR_REMOTE_KVS
    stats = scheduler.make_stats()
    # Waiting: b1, compiling, base, compiled, loading; deferred: b1, compiling, loading.
    assert (stats.num_waiting, stats.num_waiting_deferred) == (5, 3)
    scheduler.grammars.ready.add("compiling")
    assert scheduler.make_stats().num_waiting_deferred == 2


def test_without_constraints_every_waiting_request_waits_for_capacity() -> None:
    scheduler = make_scheduler()
    for i in range(4):
        add(scheduler, f"r{i}", "a")
    scheduler.schedule()
    stats = scheduler.make_stats()
    assert (stats.num_waiting, stats.num_waiting_deferred) == (2, 0)
