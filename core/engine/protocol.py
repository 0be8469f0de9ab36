"""The frontend <-> engine-core contract: msgspec structs that cross a ZMQ socket.

Owned by the engine core (DESIGN.md section 4). The frontend tokenizes and sends
EngineCoreRequests; the engine core answers with EngineCoreOutputs holding new token ids
per request, never text: detokenization stays in the frontend process.

The outputs (EngineCoreOutput, EngineCoreOutputs, SchedulerStats) are produced by the
scheduler, which is part of the engine core, and FinishReason and EngineCoreEvent belong to
the request's lifecycle: they are defined below this package (`core.scheduler.output`,
`core.request`) so that the package graph stays acyclic, and re-exported here, the one
module frontend code imports the contract from.
"""

from __future__ import annotations

import msgspec

from core.lora.request import LoRARequest
from core.multimodal.inputs import MultiModalFeature
from core.pooling.params import PoolingParams
from core.request import EngineCoreEvent, EngineCoreEventType, FinishReason
from core.sampling_params import SamplingParams
from core.scheduler.output import (
    EngineCoreOutput,
    EngineCoreOutputs,
    SchedulerStats,
    SpecDecodingStats,
)

__all__ = [
    "EngineCoreEvent",
    "EngineCoreEventType",
    "EngineCoreOutput",
    "EngineCoreOutputs",
    "EngineCoreRequest",
    "FinishReason",
    "SchedulerStats",
    "SpecDecodingStats",
]


class EngineCoreRequest(msgspec.Struct, kw_only=True, array_like=True):
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams | None  # None: a pooled request (pooling_params)
    eos_token_id: int | None
    arrival_time: float
    priority: int = 0  # lower runs first under the priority policy
    cache_salt: str | None = None  # requests with different salts never share cache
    lora_request: LoRARequest | None = None  # None: the base model
    pooling_params: PoolingParams | None = None  # set: embed the prompt (--runner pooling)
    mm_features: list[MultiModalFeature] | None = None  # multimodal items, in prompt order
