"""What the scheduler reports to the frontend after each step.

The scheduler is part of the engine core, so these msgspec structs are defined here, below
`core.engine`, which re-exports them in its frontend <-> engine-core contract
(`core.engine.protocol`); frontend code imports them from there. An output carries new
token ids per request, never text: detokenization stays in the frontend process.
"""

from __future__ import annotations

from typing import Any

import msgspec

from core.request import EngineCoreEvent, FinishReason
from core.worker.contract import LogprobsLists

__all__ = ["EngineCoreOutput", "EngineCoreOutputs", "SchedulerStats", "SpecDecodingStats"]


class EngineCoreOutput(msgspec.Struct, kw_only=True, array_like=True, omit_defaults=True):
    request_id: str
    new_token_ids: list[int]
    new_logprobs: LogprobsLists | None = None
    new_prompt_logprobs: LogprobsLists | None = None
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None  # the stop token id (stop strings: frontend)
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    # Lifecycle events since the request's previous output (queued, scheduled, preempted).
    events: list[EngineCoreEvent] | None = None
    # A pooled request's vector (--runner pooling), in its one and final output.
    pooling_output: list[float] | None = None
    # The KV connector's answer for the client when the request finished (vLLM's
    # kv_transfer_params: where a decode engine fetches this prefill's KV).
    kv_transfer_params: dict[str, Any] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class SpecDecodingStats(msgspec.Struct, kw_only=True):
    """Cumulative counts of speculative decoding since the engine started.

    A "draft" is one request's drafts verified in one step; `num_accepted_tokens_per_pos[i]`
    counts the drafts whose token at position i (0-based) was accepted.
    """

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = msgspec.field(default_factory=list)

    @classmethod
    def empty(cls, num_speculative_tokens: int) -> SpecDecodingStats:
        return cls(num_accepted_tokens_per_pos=[0] * num_speculative_tokens)

    def observe(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """Count one verified draft of `num_draft_tokens`, of which the first
        `num_accepted_tokens` were accepted."""
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        for pos in range(num_accepted_tokens):
            self.num_accepted_tokens_per_pos[pos] += 1

    def snapshot(self) -> SpecDecodingStats:
        return SpecDecodingStats(
            num_drafts=self.num_drafts,
            num_draft_tokens=self.num_draft_tokens,
            num_accepted_tokens=self.num_accepted_tokens,
            num_accepted_tokens_per_pos=list(self.num_accepted_tokens_per_pos),
        )

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens / draft tokens (0 before any draft)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens a verifying step emits on average: the accepted drafts plus the target's
        own token (1 means no draft was ever accepted)."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0


class SchedulerStats(msgspec.Struct, kw_only=True):
    """The scheduler's state after a step, for logs and metrics."""

    num_running: int
    num_waiting: int
    kv_cache_usage: float
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_preemptions: int
    # Of num_waiting, those a transient constraint holds whatever room the batch has
    # (core.scheduler.waiting_reasons); the others wait for capacity.
    num_waiting_deferred: int = 0
    # With a KV connector: prompt tokens of the requests that asked it, and those it
    # supplied past the local prefix-cache hit (cumulative, as the local ones).
    external_prefix_cache_queries: int = 0
    external_prefix_cache_hits: int = 0
    # KV the connector moved (blocks, bytes) and loads that failed.
    kv_transfer_blocks: int = 0
    kv_transfer_bytes: int = 0
    kv_transfer_failed_loads: int = 0
    spec_decoding: SpecDecodingStats | None = None  # None: speculation is off
    # With --enable-eplb: the experts' load imbalance the workers last measured.
    expert_imbalance: float | None = None
    # {adapter name: number of requests} of the running and the waiting LoRA requests.
    running_lora_adapters: dict[str, int] = msgspec.field(default_factory=dict)
    waiting_lora_adapters: dict[str, int] = msgspec.field(default_factory=dict)
    # Multimodal models: lookups of an item's encoder output by a request and those found
    # held (cumulative), items encoded (cumulative), and the share of the encoder cache
    # that items some request still needs hold.
    mm_cache_queries: int = 0
    mm_cache_hits: int = 0
    num_encoder_inputs: int = 0
    encoder_cache_usage: float = 0.0

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
    engine_index: int = 0  # the data-parallel rank of the engine core that sent them
    # Seconds of each KV connector transfer the step's workers reported done: a histogram's
    # observations, so per step rather than cumulative as SchedulerStats' counts are.
    kv_transfer_times: list[float] = msgspec.field(default_factory=list)
    # Lock-step engines (experts spanning them): this engine starts wave N of steps, and
    # the frontend must wake the others into it (core.engine.core_proc).
    start_wave: int | None = None
