"""SchedulerOutput: what the scheduler tells the workers to compute in one step.

Part of the scheduler/worker contract (owned by the worker side, DESIGN.md section 4):
msgspec structs so they can cross a process boundary unchanged. Block ids always travel
per KV-cache group: `tuple[list[int], ...]`, one list per group, even with one group.
"""

from __future__ import annotations

from typing import Any

import msgspec

from core.sampling_params import SamplingParams


class NewRequestData(msgspec.Struct, kw_only=True):
    """A request the workers have not seen: everything needed to start computing it."""

    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    block_ids: tuple[list[int], ...]  # per KV-cache group, covering computed + scheduled
    num_computed_tokens: int  # tokens already in the KV cache (a prefix-cache hit)


class CachedRequestData(msgspec.Struct, kw_only=True):
    """Requests the workers already know, as parallel lists (one entry per request).

    A request resumed from preemption lost its blocks: its `new_block_ids` replace the
    old ones instead of extending them, and its computation restarts from
    `num_computed_tokens`.
    """

    req_ids: list[str] = msgspec.field(default_factory=list)
    resumed_from_preemption: list[bool] = msgspec.field(default_factory=list)
    new_block_ids: list[tuple[list[int], ...] | None] = msgspec.field(default_factory=list)
    num_computed_tokens: list[int] = msgspec.field(default_factory=list)


class GrammarBitmask(msgspec.Struct, kw_only=True):
    """Allowed-token bitmasks of structured-output requests this step.

    `data` holds len(req_ids) rows of `words_per_row` little-endian int32 words; bit j of
    a row allows token j.
    """

    req_ids: list[str]
    words_per_row: int
    data: bytes


class SchedulerOutput(msgspec.Struct, kw_only=True):
    scheduled_new_reqs: list[NewRequestData] = msgspec.field(default_factory=list)
    scheduled_cached_reqs: CachedRequestData = msgspec.field(default_factory=CachedRequestData)
    num_scheduled_tokens: dict[str, int] = msgspec.field(default_factory=dict)
    total_num_scheduled_tokens: int = 0
    finished_req_ids: set[str] = msgspec.field(default_factory=set)  # workers drop their state
    grammar_bitmask: GrammarBitmask | None = None
    kv_connector_metadata: Any = None  # a KVConnectorMetadata of the configured connector
