"""The LoRA seam: what a `core.lora` implementation does for the worker and the frontend.

Multi-LoRA serving as vLLM v1 does it (seed chapter 12.3): one base model, many adapters.
The implementation wraps the model's linear layers (`LinearBase.wrap_linear_method`, so
the base's method — unquantized, AWQ, GGUF — keeps its weights and matmul) and keeps two
caches: loaded adapters in host memory (LRU, `max_cpu_loras`) and `max_loras` slots in the
layers' stacked weight buffers (`slots`, vLLM's `lora_index_to_id`). Each step the model
runner asks for slots for the step's adapters (`activate`), then puts `mapping(...)` in the
forward context (`ForwardContext.lora_mapping`); every wrapped layer adds, to each token
row, the low-rank product of that row's adapter, or nothing for the base model.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection
from typing import Any

import torch
from torch import nn

from core.config import LoRAConfig
from core.lora.request import LoRARequest

__all__ = ["NO_SLOT", "LoRAManager"]

NO_SLOT = -1
"""The slot of a token that runs on the base model alone."""


class LoRAManager(ABC):
    """The adapters of one model in one worker, registered in `core.lora`.

    Built by the worker once the model's weights are loaded, as
    `cls(model, config, device, dtype)`: the constructor wraps the layers it serves and
    allocates the slot buffers on `device`. Adapters load lazily: `activate` reads from
    disk what is not in the host cache.
    """

    def __init__(
        self, model: nn.Module, config: LoRAConfig, device: torch.device, dtype: torch.dtype
    ) -> None:
        self.config = config

    @classmethod
    @abstractmethod
    def check_adapter(cls, model: nn.Module, request: LoRARequest, config: LoRAConfig) -> None:
        """Raise ValueError, naming the adapter and the field, when `request`'s adapter
        cannot run on `model`: missing files, a rank above `config.max_lora_rank`, a target
        module the model has no LoRA layer for, a weight whose shape does not fit.

        The frontend calls this before queueing the first request that uses an adapter, on
        a model built on the meta device (shapes only, no weights): it must not read
        parameter values.
        """

    @abstractmethod
    def add_adapter(self, request: LoRARequest) -> bool:
        """Load the adapter into the host cache as its most recently used entry (evicting
        the least recently used one not in a slot when the cache is full); False when it
        was there already. ValueError as `check_adapter`."""

    @abstractmethod
    def remove_adapter(self, lora_int_id: int) -> bool:
        """Drop the adapter from the host cache and its slot; False when it was not loaded."""

    @abstractmethod
    def list_adapters(self) -> list[int]:
        """The host cache's adapter ids, least recently used first."""

    @property
    @abstractmethod
    def slots(self) -> list[int | None]:
        """The adapter id in each of the `max_loras` slots (None: empty)."""

    @abstractmethod
    def activate(self, requests: Collection[LoRARequest]) -> dict[int, int]:
        """Put the step's adapters in slots: {lora_int_id: slot}.

        An adapter already in a slot keeps it; another one takes an empty slot, else the
        slot of the least recently used adapter that is not among `requests` (an adapter
        the step uses is never evicted). Every adapter in `requests` becomes more recently
        used than any other. ValueError when they are more than `max_loras` (the scheduler
        never asks for that).
        """

    @abstractmethod
    def mapping(self, token_slots: torch.Tensor) -> Any:
        """What the wrapped layers read from `ForwardContext.lora_mapping` in a forward
        whose token t runs with the adapter in slot `token_slots[t]` ([T] int64 on the
        device; NO_SLOT for the base model)."""
