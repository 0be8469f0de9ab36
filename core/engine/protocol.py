"""The frontend <-> engine-core contract: msgspec structs that cross a ZMQ socket.

Owned by the engine core (DESIGN.md section 4). The frontend tokenizes and sends
EngineCoreRequests; the engine core answers with EngineCoreOutputs holding new token ids
per request, never text: detokenization stays in the frontend process.
"""

from __future__ import annotations

import enum

import msgspec

from core.sampling_params import SamplingParams
from core.worker.output import LogprobsLists


class FinishReason(enum.IntEnum):
    """Why a request stopped; `str()` gives the OpenAI-style name."""

    STOP = 0  # eos, a stop token id or a stop string
    LENGTH = 1  # max_tokens or max_model_len
    ABORT = 2  # aborted by the client or the engine
    ERROR = 3  # the engine could not serve it (e.g. a grammar failed to compile)

    def __str__(self) -> str:
        return self.name.lower()


class EngineCoreRequest(msgspec.Struct, kw_only=True, array_like=True):
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_id: int | None
    arrival_time: float
    priority: int = 0  # lower runs first under the priority policy
    cache_salt: str | None = None  # requests with different salts never share cache
    lora_name: str | None = None


class EngineCoreOutput(msgspec.Struct, kw_only=True, array_like=True, omit_defaults=True):
    request_id: str
    new_token_ids: list[int]
    new_logprobs: LogprobsLists | None = None
    new_prompt_logprobs: LogprobsLists | None = None
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None  # the stop token id (stop strings: frontend)
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class SchedulerStats(msgspec.Struct, kw_only=True):
    """The scheduler's state after a step, for logs and metrics."""

    num_running: int
    num_waiting: int
    kv_cache_usage: float
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_preemptions: int

    @property
    def prefix_cache_hit_rate(self) -> float:
        if not self.prefix_cache_queries:
            return 0.0
        return self.prefix_cache_hits / self.prefix_cache_queries


class EngineCoreOutputs(msgspec.Struct, kw_only=True, array_like=True, omit_defaults=True):
    outputs: list[EngineCoreOutput] = msgspec.field(default_factory=list)
    timestamp: float = 0.0
    scheduler_stats: SchedulerStats | None = None
    # Requests the engine finished on its own (e.g. aborted) that the frontend must forget.
    finished_requests: set[str] = msgspec.field(default_factory=set)
