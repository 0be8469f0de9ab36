"""Request, RequestStatus and FinishReason: one request's lifecycle inside the engine core.

The scheduler has no prefill or decode phase: a request only has `num_computed_tokens`
(tokens whose KV is in the cache) and `num_tokens` (prompt + output so far), and each
step moves the first towards the second. Block hashes of full blocks are kept here,
extended as tokens arrive (by the hasher the KV cache hands out), so the prefix cache
never rehashes a block.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from core.sampling_params import SamplingParams

if TYPE_CHECKING:
    from core.engine.protocol import EngineCoreRequest
    from core.kv_cache.block_hash import BlockHash, BlockHasher
    from core.lora.request import LoRARequest
    from core.multimodal.inputs import MultiModalFeature
    from core.pooling.params import PoolingParams

__all__ = [
    "Drafts",
    "EngineCoreEvent",
    "EngineCoreEventType",
    "FinishReason",
    "Request",
    "RequestStatus",
    "check_pooled_prompt",
    "fit_max_tokens",
]


class FinishReason(enum.IntEnum):
    """Why a request stopped, as reported to the frontend; `str()` gives the OpenAI-style name."""

    STOP = 0  # eos, a stop token id or a stop string
    LENGTH = 1  # max_tokens or max_model_len
    ABORT = 2  # aborted by the client or the engine
    ERROR = 3  # the engine could not serve it (e.g. a grammar failed to compile)

    def __str__(self) -> str:
        return self.name.lower()


class RequestStatus(enum.IntEnum):
    """Where a request is; every status from FINISHED_STOPPED on is final."""

    WAITING = enum.auto()
    WAITING_FOR_REMOTE_KVS = enum.auto()  # a KV connector is still loading its prefix
    WAITING_FOR_GRAMMAR = enum.auto()  # its structured-output grammar is compiling
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()  # lost its blocks; recomputes from the prefix cache
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_ERROR = enum.auto()

    def is_finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED

    def finish_reason(self) -> FinishReason | None:
        """The reason reported to the frontend; None while the request is unfinished."""
        return _FINISH_REASONS.get(self)


class EngineCoreEventType(enum.IntEnum):
    """A change in a request's life inside the engine core that the frontend's metrics time."""

    QUEUED = 1  # added to the waiting queue
    SCHEDULED = 2  # admitted to the running batch (again, after a preemption)
    PREEMPTED = 3  # sent back to wait; it will be recomputed


class EngineCoreEvent(msgspec.Struct, array_like=True, frozen=True):
    """One event with the engine core's `time.monotonic()`: the frontend only subtracts such
    timestamps from each other (never from its own clock), so one engine's intervals never
    mix two processes' clocks."""

    type: EngineCoreEventType
    timestamp: float


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH_CAPPED: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED: FinishReason.ABORT,
    RequestStatus.FINISHED_ERROR: FinishReason.ERROR,
}


@dataclass
class Drafts:
    """A request's speculative drafts: proposed after one step, verified by the next.

    They are not part of the request's tokens (nor of its block hashes) until the target
    accepts them. The scheduler sets the proposer's drafts that the next step may verify,
    cuts them when it schedules that step to those the step's tokens reach (`cut`), and
    drops them when the request is preempted or finishes (`clear`).
    """

    token_ids: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.token_ids)

    def cut(self, num_reached: int) -> None:
        """Keep the first `num_reached` drafts (none when it is not positive)."""
        del self.token_ids[max(num_reached, 0) :]

    def clear(self) -> None:
        self.token_ids = []


class Request:
    """A request as the scheduler and the KV-cache manager see it.

    A request is sampled (`sampling_params`) or pooled (`pooling_params`, --runner
    pooling): exactly one of them is set. `max_tokens` is resolved: the sampling params'
    value, capped by the room left under `max_model_len` when that is known; 0 for a
    pooled request, which finishes with its prompt. `num_cached_tokens` is the
    prefix-cache hit of the first admission, -1 until the scheduler has looked it up.
    `block_hashes` holds one hash per full block of `all_token_ids` when a block hasher
    is given.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams | None,
        eos_token_id: int | None,
        arrival_time: float,
        *,
        priority: int = 0,
        cache_salt: str | None = None,
        lora_request: LoRARequest | None = None,
        block_hasher: BlockHasher | None = None,
        max_model_len: int | None = None,
        pooling_params: PoolingParams | None = None,
        mm_features: list[MultiModalFeature] | None = None,
    ) -> None:
        if not prompt_token_ids:
            raise ValueError(f"request {request_id}: prompt_token_ids must not be empty")
        if (sampling_params is None) == (pooling_params is None):
            raise ValueError(
                f"request {request_id}: give exactly one of sampling_params and pooling_params"
            )
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.eos_token_id = eos_token_id
        self.arrival_time = arrival_time
        self.priority = priority
        self.cache_salt = cache_salt
        self.lora_request = lora_request
        self.pooling_params = pooling_params
        self.mm_features = _check_features(request_id, mm_features or [], len(prompt_token_ids))
        if sampling_params is None:
            if max_model_len is not None:
                check_pooled_prompt(len(prompt_token_ids), max_model_len)
            self.max_tokens = 0
        else:
            self.max_tokens = _resolve_max_tokens(
                request_id, sampling_params, len(prompt_token_ids), max_model_len
            )

        self.status = RequestStatus.WAITING
        self.stop_reason: int | str | None = None
        self.output_token_ids: list[int] = []
        self.all_token_ids: list[int] = list(prompt_token_ids)
        self.num_computed_tokens = 0
        # Async scheduling: tokens that steps already started will sample for this request
        # (not yet in all_token_ids); a step may compute them before they are known.
        self.num_output_placeholders = 0
        # The index of the first step that may schedule it (set when the scheduler takes it):
        # outputs of earlier steps under its id were another request's.
        self.first_step_index = 0
        self.drafts = Drafts()
        self.num_cached_tokens = -1
        self.num_preemptions = 0
        self._events: list[EngineCoreEvent] = []

        self._block_hasher = block_hasher
        self.block_hashes: list[BlockHash] = []
        self._update_block_hashes()

    @classmethod
    def from_engine_core_request(
        cls,
        request: EngineCoreRequest,
        block_hasher: BlockHasher | None = None,
        max_model_len: int | None = None,
    ) -> Request:
        return cls(
            request.request_id,
            request.prompt_token_ids,
            request.sampling_params,
            request.eos_token_id,
            request.arrival_time,
            priority=request.priority,
            cache_salt=request.cache_salt,
            lora_request=request.lora_request,
            block_hasher=block_hasher,
            max_model_len=max_model_len,
            pooling_params=request.pooling_params,
            mm_features=request.mm_features,
        )

    @property
    def kv_transfer_params(self) -> dict[str, Any] | None:
        """What the client asked of the KV connector for this request (vLLM's
        `kv_transfer_params`, carried in sampling_params.extra_args); None: nothing."""
        extra = None if self.sampling_params is None else self.sampling_params.extra_args
        return None if extra is None else extra.get("kv_transfer_params")

    @property
    def lora_name(self) -> str | None:
        """The adapter's name, a block-hash key: adapters never share cached prefixes."""
        return None if self.lora_request is None else self.lora_request.lora_name

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        """Tokens the next step may compute: the known ones and the drafts."""
        return len(self.all_token_ids) + len(self.drafts)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished()

    def append_output_token_ids(self, token_ids: int | list[int]) -> None:
        """Add sampled tokens and hash every block they complete."""
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        self.output_token_ids.extend(token_ids)
        self.all_token_ids.extend(token_ids)
        self._update_block_hashes()

    def get_finished_reason(self) -> FinishReason | None:
        return self.status.finish_reason()

    def record_event(self, event_type: EngineCoreEventType) -> None:
        self._events.append(EngineCoreEvent(event_type, time.monotonic()))

    def take_events(self) -> list[EngineCoreEvent] | None:
        """The events since the last call (None when there are none): each reaches the
        frontend once, with the request's next output."""
        events, self._events = self._events, []
        return events or None

    def _update_block_hashes(self) -> None:
        if self._block_hasher is not None:
            self.block_hashes.extend(self._block_hasher(self))

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, {self.status.name}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens})"
        )


def _check_features(
    request_id: str, features: list[MultiModalFeature], num_prompt_tokens: int
) -> list[MultiModalFeature]:
    """The items, checked to lie inside the prompt in order without overlapping (the
    scheduler and the workers walk them in that order)."""
    end = 0
    for feature in features:
        placeholder = feature.placeholder
        if (
            placeholder.offset < end
            or placeholder.length < 1
            or placeholder.end > num_prompt_tokens
        ):
            raise ValueError(
                f"request {request_id}: multimodal placeholders must be non-empty, in prompt "
                "order, inside the prompt and apart"
            )
        end = placeholder.end
    return features


def _resolve_max_tokens(
    request_id: str, params: SamplingParams, num_prompt_tokens: int, max_model_len: int | None
) -> int:
    """How many tokens the request may generate: its own cap and the model's, whichever is lower."""
    if max_model_len is not None:
        return fit_max_tokens(params.max_tokens, num_prompt_tokens, max_model_len)
    if params.max_tokens is None:
        raise ValueError(f"request {request_id}: max_tokens is None and max_model_len unknown")
    return params.max_tokens


def fit_max_tokens(
    max_tokens: int | None, num_prompt_tokens: int, max_model_len: int, *, exact: bool = False
) -> int:
    """How many tokens a request may generate under `max_model_len`: the one fit rule.

    The prompt and at least one generated token must fit, else ValueError naming prompt.
    `max_tokens` None means all the room the prompt leaves; a larger value is capped to it,
    unless `exact` (the caller asked for exactly that many, as an explicit max_tokens of an
    OpenAI request does): then it is a ValueError naming max_tokens. The frontend's
    InputProcessor and the OpenAI server resolve with it before a request is queued; the
    engine core's Request applies it again as a last line of defence. It lives here, below
    both, because the engine core imports nothing of the frontend.
    """
    room = max_model_len - num_prompt_tokens
    if room < 1:
        raise ValueError(
            f"prompt is {num_prompt_tokens} tokens long, which leaves no room to generate under "
            f"max_model_len {max_model_len}: the prompt and at least one generated token must fit"
        )
    if max_tokens is None:
        return room
    if exact and max_tokens > room:
        raise ValueError(
            f"max_tokens is {max_tokens}, but the prompt is {num_prompt_tokens} tokens and "
            f"max_model_len is {max_model_len}: at most {room} tokens can be generated"
        )
    return min(max_tokens, room)


def check_pooled_prompt(num_prompt_tokens: int, max_model_len: int) -> None:
    """A pooled request's fit rule: it generates nothing, so its prompt may fill the whole
    `max_model_len`, not more (ValueError naming prompt). The frontend checks it before
    queueing; the engine core's Request again, as with `fit_max_tokens`."""
    if num_prompt_tokens > max_model_len:
        raise ValueError(
            f"prompt is {num_prompt_tokens} tokens long, more than max_model_len {max_model_len}"
        )
