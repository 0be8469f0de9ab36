"""A toy KV connector the kit's own tests run it against (core ships none).

Requests are saved whole into a process-wide store keyed by their prompt, and a later
request with the same prompt loads all but its last token from there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from core.kv_transfer.interface import KVConnector, KVConnectorMetadata


@dataclass
class ToyMetadata(KVConnectorMetadata):
    loads: dict[tuple[int, ...], list[int]] = field(default_factory=dict)  # prompt -> blocks
    saves: dict[tuple[int, ...], list[int]] = field(default_factory=dict)


class ToyStoreConnector(KVConnector):
    STORE: ClassVar[dict[tuple[int, ...], dict[str, torch.Tensor]]] = {}

    def __init__(self, config: Any, role) -> None:
        super().__init__(config, role)
        self._loads: dict[tuple[int, ...], list[int]] = {}
        self._loading: dict[str, tuple[int, ...]] = {}  # request id -> the prompt it loads
        self._kv_caches: dict[str, torch.Tensor] = {}

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        stored = len(request.prompt_token_ids) - 1 if self._key(request) in self.STORE else 0
        return max(stored - num_computed_tokens, 0), False

    def update_state_after_alloc(self, request, block_ids, num_external_tokens):
        if num_external_tokens:
            self._loads[self._key(request)] = block_ids[0]
            self._loading[request.request_id] = self._key(request)

    def update_connector_output(self, output):
        for req_id in output.failed_recving:  # what failed to load is never offered again
            self.STORE.pop(self._loading.pop(req_id, ()), None)

    def build_connector_meta(self, scheduler_output):
        saves = {
            tuple(r.prompt_token_ids): r.block_ids[0] for r in scheduler_output.scheduled_new_reqs
        }
        metadata, self._loads = ToyMetadata(self._loads, saves), {}
        return metadata

    def register_kv_caches(self, kv_caches):
        self._kv_caches = kv_caches

    def start_load_kv(self, forward_context):
        for key, blocks in self.connector_metadata.loads.items():
            for layer, cache in self._kv_caches.items():
                cache[blocks] = self.STORE[key][layer]

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata):
        for key, blocks in self.connector_metadata.saves.items():
            self.STORE.setdefault(key, {})[layer_name] = kv_layer[blocks].clone()

    @staticmethod
    def _key(request) -> tuple[int, ...]:
        return tuple(request.prompt_token_ids)
