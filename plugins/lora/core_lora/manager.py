"""LoRAModelManager: core-lora's `core.lora` implementation ("default").

Two LRU caches, as vLLM's LoRAModelManager (seed chapter 12.3): adapters read from disk
are kept in host memory (`max_cpu_loras`), and `max_loras` of them sit in the slots of
every wrapped layer's stacked buffers (`slots` is vLLM's `lora_index_to_id`). A step
activates its adapters: one already in a slot stays there; another is read from the host
cache (or from disk) into a free slot, or into the slot of the least recently activated
adapter that the step does not use. Evicting an adapter from the host cache empties its
slot too; an adapter the step uses is evicted from neither.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection

import torch
from torch import nn

from core.config import LoRAConfig
from core.lora.interface import LoRAManager
from core.lora.request import LoRARequest
from core.models.layers.linear import LinearBase
from core_lora.adapter import LoRAAdapter, check_adapter, load_adapter, lora_targets
from core_lora.layer import LoRALinearMethod
from core_lora.mapping import SlotMapping

__all__ = ["LoRAModelManager"]


class LoRAModelManager(LoRAManager):
    def __init__(
        self, model: nn.Module, config: LoRAConfig, device: torch.device, dtype: torch.dtype
    ) -> None:
        super().__init__(model, config, device, dtype)
        self.dtype = dtype
        self.targets = lora_targets(model)
        names = {target.layer for target in self.targets.values()}
        self.layers: dict[str, LinearBase] = {
            name: module for name, module in model.named_modules() if name in names
        }
        for layer in self.layers.values():
            layer.wrap_linear_method(
                lambda base: LoRALinearMethod(base, config.max_loras, config.max_lora_rank)
            )
        self._host: OrderedDict[int, LoRAAdapter] = OrderedDict()  # least recent first
        self._slots: list[int | None] = [None] * config.max_loras
        self._activated: OrderedDict[int, None] = OrderedDict()  # adapters in slots, LRU

    @classmethod
    def check_adapter(cls, model: nn.Module, request: LoRARequest, config: LoRAConfig) -> None:
        check_adapter(request, lora_targets(model), config)

    @property
    def slots(self) -> list[int | None]:
        return list(self._slots)

    def list_adapters(self) -> list[int]:
        return list(self._host)

    def add_adapter(self, request: LoRARequest) -> bool:
        return self._load(request, keep=frozenset())

    def remove_adapter(self, lora_int_id: int) -> bool:
        if self._host.pop(lora_int_id, None) is None:
            return False
        self._deactivate(lora_int_id)
        return True

    def activate(self, requests: Collection[LoRARequest]) -> dict[int, int]:
        step = sorted(set(requests), key=lambda r: r.lora_int_id)
        if len(step) > self.config.max_loras:
            raise ValueError(
                f"{len(step)} adapters in one step, more than max_loras {self.config.max_loras}"
            )
        keep = frozenset(r.lora_int_id for r in step)
        for request in step:
            self._load(request, keep)
        placed = {}
        for request in step:
            adapter_id = request.lora_int_id
            if adapter_id not in self._activated:
                self._write_slot(self._free_slot(keep), self._host[adapter_id])
            self._activated.move_to_end(adapter_id)
            placed[adapter_id] = self._slots.index(adapter_id)
        return placed

    def mapping(self, token_slots: torch.Tensor) -> SlotMapping:
        return SlotMapping(token_slots)

    def _load(self, request: LoRARequest, keep: frozenset[int]) -> bool:
        """Into the host cache as its most recent entry; False when it was there."""
        adapter_id = request.lora_int_id
        if adapter_id in self._host:
            self._host.move_to_end(adapter_id)
            return False
        adapter = load_adapter(request, self.targets, self.config, self.dtype)
        while len(self._host) >= self.config.max_cpu_loras:
            victim = next((i for i in self._host if i not in keep), None)
            if victim is None:
                raise ValueError(
                    f"max_cpu_loras {self.config.max_cpu_loras} cannot hold the step's adapters"
                )
            self.remove_adapter(victim)
        self._host[adapter_id] = adapter
        return True

    def _free_slot(self, keep: frozenset[int]) -> int:
        """An empty slot, else the slot of the least recently activated adapter not kept."""
        if None in self._slots:
            return self._slots.index(None)
        victim = next(i for i in self._activated if i not in keep)
        slot = self._slots.index(victim)
        self._deactivate(victim)
        return slot

    def _write_slot(self, slot: int, adapter: LoRAAdapter) -> None:
        for name, layer in self.layers.items():
            method = layer.linear_method
            assert isinstance(method, LoRALinearMethod)  # wrapped in __init__
            method.set_slot(layer, slot, adapter.weights.get(name, {}))
        self._slots[slot] = adapter.request.lora_int_id
        self._activated[adapter.request.lora_int_id] = None

    def _deactivate(self, adapter_id: int) -> None:
        """Empty the adapter's slot, if it has one (its rows become zero)."""
        if adapter_id not in self._activated:
            return
        del self._activated[adapter_id]
        slot = self._slots.index(adapter_id)
        for layer in self.layers.values():
            layer.linear_method.set_slot(layer, slot, {})
        self._slots[slot] = None
