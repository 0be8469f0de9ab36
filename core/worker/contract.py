"""The scheduler <-> worker contract: what the scheduler asks for each step, what comes back.

`SchedulerOutput` tells the workers what to compute in one step; `ModelRunnerOutput` is
what they computed. Both are msgspec structs so they cross a process boundary (to a
worker process, over a socket) unchanged. Block ids always travel per KV-cache group:
`tuple[list[int], ...]`, one list per group, even with one group.

Owned by the worker side (DESIGN.md section 4), and the one worker module the scheduler
may import: it depends on nothing heavier than msgspec, SamplingParams, PoolingParams and the
multimodal features.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from core.lora.request import LoRARequest
from core.multimodal.inputs import MultiModalFeature
from core.pooling.params import PoolingParams
from core.sampling_params import SamplingParams

if TYPE_CHECKING:
    from core.sample.logprobs import LogprobsTensors

__all__ = [
    "BITS_PER_WORD",
    "CachedRequestData",
    "GrammarBitmask",
    "LogprobsLists",
    "ModelRunnerOutput",
    "NewRequestData",
    "SchedulerOutput",
]


class NewRequestData(msgspec.Struct, kw_only=True):
    """A request the workers have not seen: everything needed to start computing it."""

    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams | None  # exactly one of these two is set
    block_ids: tuple[list[int], ...]  # per KV-cache group, covering computed + scheduled
    num_computed_tokens: int  # tokens already in the KV cache (a prefix-cache hit)
    lora_request: LoRARequest | None = None  # None: the base model
    pooling_params: PoolingParams | None = None  # set: pooled (--runner pooling), not sampled
    mm_features: list[MultiModalFeature] | None = None  # multimodal items, in prompt order


class CachedRequestData(msgspec.Struct, kw_only=True):
    """Requests the workers already know, as parallel lists (one entry per request).

    A request resumed from preemption lost its blocks: its `new_block_ids` replace the
    old ones instead of extending them, and its computation restarts from
    `num_computed_tokens`. Under pipeline parallelism `new_token_ids` carries the tokens
    sampled since the request was last scheduled, for the stages that did not sample them
    (empty without pipeline parallelism: the one stage sampled them itself).
    """

    req_ids: list[str] = msgspec.field(default_factory=list)
    resumed_from_preemption: list[bool] = msgspec.field(default_factory=list)
    new_block_ids: list[tuple[list[int], ...] | None] = msgspec.field(default_factory=list)
    num_computed_tokens: list[int] = msgspec.field(default_factory=list)
    new_token_ids: list[list[int]] = msgspec.field(default_factory=list)


BITS_PER_WORD = 32  # a GrammarBitmask word is an int32


class GrammarBitmask(msgspec.Struct, kw_only=True):
    """Allowed-token bitmasks of structured-output requests this step.

    `data` holds len(req_ids) rows of `words_per_row` little-endian int32 words: bit j of
    word j // 32 (bit 0 the least significant) allows token j, so the bytes of a row read
    least significant bit first are the token ids in order. A request with n drafts has
    n + 1 rows, listed consecutively: the i-th occurrence of its id masks its i-th verified
    position (the grammar advanced over the drafts before it).
    """

    req_ids: list[str]
    words_per_row: int
    data: bytes


class SchedulerOutput(msgspec.Struct, kw_only=True):
    """What the scheduler tells the workers to compute in one step."""

    scheduled_new_reqs: list[NewRequestData] = msgspec.field(default_factory=list)
    scheduled_cached_reqs: CachedRequestData = msgspec.field(default_factory=CachedRequestData)
    num_scheduled_tokens: dict[str, int] = msgspec.field(default_factory=dict)
    total_num_scheduled_tokens: int = 0
    finished_req_ids: set[str] = msgspec.field(default_factory=set)  # workers drop their state
    # Drafts to verify this step, per request that has any; a request's scheduled tokens
    # count them (its known tokens, then these).
    scheduled_spec_decode_tokens: dict[str, list[int]] = msgspec.field(default_factory=dict)
    grammar_bitmask: GrammarBitmask | None = None
    kv_connector_metadata: Any = None  # a KVConnectorMetadata of the configured connector
    # Multimodal items to encode before this step's forward: request id -> indices into
    # its mm_features (the request may be one preempted this step: its state is kept).
    scheduled_encoder_inputs: dict[str, list[int]] = msgspec.field(default_factory=dict)
    # Encoder outputs to drop (by item identifier): no request needs them any more.
    free_encoder_mm_hashes: list[str] = msgspec.field(default_factory=list)
    # The scheduler's count of steps before this one: where steps overlap, it tells the
    # output of a step that ran a request from a later request given the same id.
    step_index: int = 0


class LogprobsLists(msgspec.Struct, kw_only=True):
    """Logprobs of N positions as plain lists (column 0 is the chosen token).

    logprob_token_ids[i] and logprobs[i] hold k + 1 entries: the chosen token, then the
    top k tokens of the raw distribution; `ranks[i]` is the chosen token's rank (1 = best).
    """

    logprob_token_ids: list[list[int]]
    logprobs: list[list[float]]
    ranks: list[int]

    @classmethod
    def from_tensors(
        cls, tensors: LogprobsTensors, start: int, end: int, k: int | None
    ) -> LogprobsLists:
        """Rows [start, end) of `tensors` as lists, each cut to a request's own k + 1 columns."""
        width = (k or 0) + 1
        return cls(
            logprob_token_ids=tensors.logprob_token_ids[start:end, :width].tolist(),
            logprobs=tensors.logprobs[start:end, :width].tolist(),
            ranks=tensors.selected_token_ranks[start:end].tolist(),
        )


class ModelRunnerOutput(msgspec.Struct, kw_only=True):
    """What the workers computed in one step."""

    req_ids: list[str]  # every request scheduled this step, in batch order
    # One list per request: the tokens emitted this step (one, or with drafts the accepted
    # drafts and the target's own token), or empty when the request did not reach the end
    # of its known tokens (a partial prefill chunk).
    sampled_token_ids: list[list[int]]
    # With speculative decoding: drafts for the next step, one list per request (maybe empty).
    spec_token_ids: list[list[int]] | None = None
    logprobs: dict[str, LogprobsLists] = msgspec.field(default_factory=dict)
    # Logprobs of the prompt tokens covered this step (a prefill chunk), per request.
    prompt_logprobs: dict[str, LogprobsLists] = msgspec.field(default_factory=dict)
    # Pooled vectors of the requests whose prompt this step completed (--runner pooling);
    # each such request is done.
    pooler_output: dict[str, list[float]] = msgspec.field(default_factory=dict)
    # With --kv-transfer-config: the connector's finished transfers (a KVConnectorOutput).
    kv_connector_output: Any = None
    # With --enable-eplb: the experts' measured load imbalance over the current window
    # (most tokens on one rank over the mean; core.distributed.eplb).
    expert_imbalance: float | None = None
    # With experts spanning data-parallel engines (lock-step): the tokens every engine
    # scheduled this step, summed; 0 ends the engines' wave of steps.
    num_tokens_across_dp: int | None = None
    # How long this rank took to run the step: where steps overlap (async scheduling), the
    # engine's measured step budgets learn from it, not from the time it waited.
    execute_seconds: float = 0.0
