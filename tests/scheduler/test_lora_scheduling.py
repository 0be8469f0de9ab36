"""The scheduler with LoRA adapters: at most max_loras distinct adapters run at once."""

from __future__ import annotations

import pytest
import torch

from core.config import EngineConfig, LoRAConfig
from core.kv_cache.grouping import kv_cache_config_for_blocks
from core.kv_cache.kv_cache_manager import KVCacheManager
from core.kv_cache.spec import FullAttentionSpec
from core.lora.request import LoRARequest
from core.request import Request
from core.sampling_params import SamplingParams
from core.scheduler.scheduler import Scheduler
from core.worker.contract import ModelRunnerOutput

MAX_LEN = 64
ADAPTERS = {name: LoRARequest(name, i, f"/adapters/{name}") for i, name in enumerate("abc", 1)}


def make_scheduler(lora: LoRAConfig | None) -> Scheduler:
    spec = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=2, dtype=torch.float32)
    kv = KVCacheManager(kv_cache_config_for_blocks({"layer.0": spec}, 64), MAX_LEN)
    return Scheduler(EngineConfig(lora=lora), kv, MAX_LEN)


def add(scheduler: Scheduler, req_id: str, adapter: str | None, max_tokens: int = 2) -> Request:
    request = Request(
        req_id,
        [1, 2, 3],
        SamplingParams(temperature=0.0, max_tokens=max_tokens),
        eos_token_id=None,
        arrival_time=0.0,
        lora_request=None if adapter is None else ADAPTERS[adapter],
        block_hasher=scheduler.kv.block_hasher,
        max_model_len=MAX_LEN,
    )
    scheduler.add_request(request)
    return request


def step(scheduler: Scheduler) -> set[str]:
    """One step that samples token 7 for every request reaching its end; the ids scheduled."""
    so = scheduler.schedule()
    req_ids = list(so.num_scheduled_tokens)
    sampled = [
        [7] if scheduler.requests[r].num_computed_tokens >= scheduler.requests[r].num_tokens else []
        for r in req_ids
    ]
    scheduler.update_from_output(so, ModelRunnerOutput(req_ids=req_ids, sampled_token_ids=sampled))
    return set(req_ids)


def test_a_request_needing_another_adapter_waits_and_later_ones_go_first() -> None:
    scheduler = make_scheduler(LoRAConfig(max_loras=1))
    add(scheduler, "a1", "a")
    add(scheduler, "b1", "b")
    add(scheduler, "a2", "a")
    add(scheduler, "base", None)
    assert step(scheduler) == {"a1", "a2", "base"}
    stats = scheduler.make_stats()
    assert stats.running_lora_adapters == {"a": 2} and stats.waiting_lora_adapters == {"b": 1}
    assert step(scheduler) == {"a1", "a2", "base"}  # the a-requests finish here
    assert step(scheduler) == {"b1"}
    assert scheduler.make_stats().running_lora_adapters == {"b": 1}


@pytest.mark.parametrize("max_loras", [1, 2, 3])
def test_distinct_adapters_running_never_exceed_max_loras(max_loras: int) -> None:
    scheduler = make_scheduler(LoRAConfig(max_loras=max_loras))
    for i in range(9):
        add(scheduler, f"r{i}", "abc"[i % 3], max_tokens=1 + i % 4)
    finished = 0
    while scheduler.has_unfinished_requests():
        step(scheduler)
        running = {r.lora_name for r in scheduler.running}
        assert len(running) <= max_loras, running
        finished += 1
    assert finished > 0 and not scheduler.requests


def test_a_lora_request_is_refused_when_lora_is_off() -> None:
    with pytest.raises(ValueError, match="lora_request"):
        add(make_scheduler(None), "a1", "a")
