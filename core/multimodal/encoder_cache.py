"""The scheduler's view of the encoder cache: which items' encoder outputs the workers
hold, and room for more.

An item's encoder output is computed once and kept, keyed by the item's identifier,
while any request still has to compute prompt positions inside its placeholder; then it
becomes freeable but stays, so a later request with the same image reuses it, until room
is needed (least recently freed first). The workers drop what the scheduler evicts: each
step's SchedulerOutput lists the identifiers evicted since the last one. Sizes count
embeddings (placeholder positions), one per prompt position an item takes.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from core.config import SchedulerConfig
from core.multimodal.inputs import MultiModalFeature

__all__ = ["EncoderBudget", "EncoderCacheManager"]


@dataclass(frozen=True)
class EncoderBudget:
    """How many embeddings one step may encode (`compute`) and the cache holds (`cache`).

    Unset, the compute budget is the step's token budget, and an item larger than it is
    encoded alone in its step; the cache holds at least one prompt's worth
    (max_model_len), so any item that fits a prompt fits it. Set explicitly, an item
    larger than either is refused by the frontend (`check_item`).
    """

    compute: int
    cache: int
    compute_is_explicit: bool
    cache_is_explicit: bool

    @classmethod
    def of(cls, config: SchedulerConfig, max_model_len: int) -> EncoderBudget:
        step = config.max_step_tokens(max_model_len)
        compute = config.max_num_encoder_input_tokens or step
        cache = config.encoder_cache_size or max(compute, step, max_model_len)
        return cls(
            compute,
            cache,
            config.max_num_encoder_input_tokens is not None,
            config.encoder_cache_size is not None,
        )

    def check_item(self, feature: MultiModalFeature) -> None:
        """ValueError naming multi_modal_data when an item can never be scheduled."""
        size = feature.placeholder.length
        limits = (
            (self.compute, self.compute_is_explicit, "--max-num-encoder-input-tokens"),
            (self.cache, self.cache_is_explicit, "--encoder-cache-size"),
        )
        for limit, explicit, flag in limits:
            if explicit and size > limit:
                raise ValueError(
                    f"multi_modal_data.{feature.modality}: an item of {size} embeddings "
                    f"exceeds {flag} {limit}"
                )


class EncoderCacheManager:
    """Encoder outputs by item identifier, with the requests that still need each."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.num_free = capacity  # not held by any item, referenced or freeable
        self._sizes: dict[str, int] = {}  # every item held (computed or being computed)
        self._users: dict[str, set[str]] = {}  # item -> requests still needing it
        self._freeable: OrderedDict[str, int] = OrderedDict()  # unreferenced, oldest first
        self._evicted: list[str] = []  # since the last step's output
        self.num_queries = 0  # lookups of an item (counted once per request and item)
        self.num_hits = 0  # of which found held

    def lookup(self, request_id: str, feature: MultiModalFeature) -> bool:
        """Whether the item is held; if so the request now uses it (and it cannot be
        evicted until the request is done with it)."""
        identifier = feature.identifier
        if identifier not in self._sizes:
            return False
        self._freeable.pop(identifier, None)
        self._users.setdefault(identifier, set()).add(request_id)
        return True

    def count_query(self, hit: bool) -> None:
        self.num_queries += 1
        self.num_hits += hit

    def holds(self, identifier: str) -> bool:
        return identifier in self._sizes

    def uses(self, request_id: str, identifier: str) -> bool:
        """Whether the request already references the item."""
        return request_id in self._users.get(identifier, ())

    def room(self) -> int:
        """Embeddings that new items may take: the free room and the freeable items'."""
        return self.num_free + sum(self._freeable.values())

    def freeable_size(self, identifier: str) -> int:
        """The item's size when it is freeable (counted in `room`), else 0."""
        return self._freeable.get(identifier, 0)

    def allocate(self, request_id: str, feature: MultiModalFeature) -> None:
        """Hold room for the item's output (computed this step), evicting freeable items
        as needed; the caller checked `room`."""
        size = feature.placeholder.length
        while self.num_free < size:
            identifier, freed = self._freeable.popitem(last=False)
            del self._sizes[identifier]
            self._users.pop(identifier, None)
            self.num_free += freed
            self._evicted.append(identifier)
        self.num_free -= size
        self._sizes[feature.identifier] = size
        self._users[feature.identifier] = {request_id}

    def release(self, request_id: str, identifier: str) -> None:
        """The request no longer needs the item (its positions are in the KV cache, or it
        left); unreferenced, the item becomes freeable."""
        users = self._users.get(identifier)
        if users is None or request_id not in users:
            return
        users.discard(request_id)
        if not users:
            del self._users[identifier]
            self._freeable[identifier] = self._sizes[identifier]

    def release_all(self, request_id: str, features: list[MultiModalFeature]) -> None:
        for feature in features:
            self.release(request_id, feature.identifier)

    def take_evicted(self) -> list[str]:
        """The items evicted since the last call: the workers free their outputs."""
        evicted, self._evicted = self._evicted, []
        return evicted

    @property
    def usage(self) -> float:
        """The share of the cache held by items some request still needs."""
        held = self.capacity - self.num_free - sum(self._freeable.values())
        return held / self.capacity
